"""Python stubs of pruneserve's gRPC API, generated with Debian's protoc and
grpc_python_plugin into a folder put on sys.path."""
import os
import subprocess
import sys


def generate_stubs(proto_dir, out_dir):
    subprocess.run(["protoc", f"-I{proto_dir}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
                    "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
                    os.path.join(proto_dir, "pruneserve/v1/generation.proto")], check=True)
    sys.path.insert(0, out_dir)
