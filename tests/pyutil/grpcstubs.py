"""Python stubs of pruneserve's gRPC API, generated with Debian's protoc and
grpc_python_plugin into a folder put on sys.path, and the helpers the grpcio tests share."""
import os
import subprocess
import sys
import tempfile
import unittest

from serverproc import wait_for


def generate_stubs(proto_dir, out_dir):
    subprocess.run(["protoc", f"-I{proto_dir}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
                    "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
                    os.path.join(proto_dir, "pruneserve/v1/generation.proto")], check=True)
    sys.path.insert(0, out_dir)


def run_tests(proto_dir, argv, module_globals):
    """Generates the stubs, binds `grpc`, `pb` and `pb_grpc` in the test module's globals,
    runs its unittest cases and exits 0 only when they all passed."""
    with tempfile.TemporaryDirectory() as tmp:
        generate_stubs(proto_dir, tmp)
        import grpc
        from pruneserve.v1 import generation_pb2 as pb
        from pruneserve.v1 import generation_pb2_grpc as pb_grpc
        module_globals.update(grpc=grpc, pb=pb, pb_grpc=pb_grpc)
        result = unittest.main(argv=argv, verbosity=2, exit=False).result
    sys.exit(0 if result.wasSuccessful() else 1)


def wait_loaded(stub, metadata=(), timeout=60):
    """Polls GetModelInfo until the model is loaded (UNAVAILABLE while it loads)."""
    import grpc
    from pruneserve.v1 import generation_pb2 as pb

    def loaded():
        try:
            stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=1, metadata=metadata)
            return True
        except grpc.RpcError:
            return False
    assert wait_for(loaded, timeout), "the model did not load"
