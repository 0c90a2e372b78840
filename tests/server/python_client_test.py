#!/usr/bin/python3
"""An independent client: Debian's python3-grpcio with stubs generated from the
repo's proto at test time talks to the real server. Streamed greedy tokens must
equal pruneserve-run's offline output, and /metrics must parse with
prometheus_client's text parser and count what the client received."""
import argparse
import os
import subprocess
import sys
import tempfile
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from grpcstubs import generate_stubs  # noqa: E402
from serverproc import Server, wait_for  # noqa: E402

ARGS = None


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        generate_stubs(ARGS.proto_dir, cls.tmp.name)
        global grpc, pb, pb_grpc
        import grpc
        from pruneserve.v1 import generation_pb2 as pb
        from pruneserve.v1 import generation_pb2_grpc as pb_grpc
        cls.server = Server(ARGS.server, ARGS.model)
        cls.addClassCleanup(cls.server.close)  # kills it if setUpClass fails past here
        cls.metrics_url = cls.server.metrics_url
        cls.channel = grpc.insecure_channel(cls.server.grpc_addr)
        grpc.channel_ready_future(cls.channel).result(timeout=30)
        cls.stub = pb_grpc.GenerationStub(cls.channel)

        def loaded():
            try:
                cls.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=1)
                return True
            except grpc.RpcError:
                return False
        assert wait_for(loaded, 60), "model did not load"

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        code, log = cls.server.stop()
        cls.tmp.cleanup()
        assert code == 0, f"server exited with {code}:\n{log}"

    def offline(self, prompt, n):
        out = subprocess.run([ARGS.run, "--model", ARGS.model, "--prompt", prompt, "--max-new-tokens", str(n),
                              "--ignore-eos", "--print-ids", "--threads", "1"],
                             check=True, capture_output=True, text=True).stdout
        return [int(t) for t in out.split()]

    def stream(self, prompt, n):
        req = pb.GenerateRequest(text=prompt, sampling=pb.SamplingParams(temperature=0.0),
                                 stopping=pb.StoppingCriteria(max_new_tokens=n, ignore_eos=True))
        events = list(self.stub.Generate(req, timeout=60))
        self.assertTrue(events[0].HasField("prompt_info"))
        self.assertTrue(events[-1].HasField("finished"))
        self.assertEqual(sum(e.HasField("finished") for e in events), 1)
        tokens = [t for e in events if e.HasField("chunk") for t in e.chunk.token_ids]
        return tokens, events[-1].finished

    def test_1_greedy_tokens_equal_offline_and_metrics_count_them(self):
        prompts = ["Once upon a time", "Lily and Tom went to the park. They saw a big", "The cat sat on the mat."]
        received = 0
        for p in prompts:
            tokens, fin = self.stream(p, 32)
            self.assertEqual(tokens, self.offline(p, 32), p)
            self.assertEqual(fin.reason, pb.FINISH_REASON_LENGTH)
            self.assertEqual(fin.usage.completion_tokens, len(tokens))
            received += len(tokens)

        from prometheus_client.parser import text_string_to_metric_families
        page = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        families = {f.name: f for f in text_string_to_metric_families(page)}

        def total(name, **labels):
            fam = families[name]
            return sum(s.value for s in fam.samples
                       if s.name in (name, name + "_total") and all(s.labels.get(k) == v for k, v in labels.items()))
        self.assertEqual(total("pruneserve_requests", finish_reason="length"), len(prompts))
        self.assertEqual(total("pruneserve_generation_tokens", strategy="full"), received)
        self.assertIn("pruneserve_time_to_first_token_seconds", families)
        self.assertEqual(families["pruneserve_time_to_first_token_seconds"].type, "histogram")
        self.assertEqual(total("pruneserve_num_requests_running"), 0)

    def test_2_invalid_argument(self):
        with self.assertRaises(grpc.RpcError) as cm:
            list(self.stub.Generate(pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(top_p=1.5)), timeout=10))
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("top_p", cm.exception.details())

    def test_3_a_repeat_prompt_hits_the_prefix_cache_until_a_flush(self):
        prompt = "Ben had a red ball and a blue kite. He liked to play in the sun. " * 3
        first, fin1 = self.stream(prompt, 8)
        again, fin2 = self.stream(prompt, 8)
        self.assertEqual(again, first)
        self.assertEqual(fin1.usage.cached_tokens, 0)
        self.assertEqual(fin2.usage.cached_tokens, (fin2.usage.prompt_tokens - 1) // 16 * 16)  # whole pages
        self.assertGreater(fin2.usage.cached_tokens, 0)
        load = self.stub.GetLoad(pb.GetLoadRequest(), timeout=10)
        self.assertGreater(load.kv[0].cached_tokens, 0)
        dropped = self.stub.FlushCache(pb.FlushCacheRequest(), timeout=10).dropped_blocks
        self.assertGreater(dropped, 0)
        self.assertEqual([kv.used_tokens for kv in self.stub.GetLoad(pb.GetLoadRequest(), timeout=10).kv], [0, 0])
        _, fin3 = self.stream(prompt, 8)
        self.assertEqual(fin3.usage.cached_tokens, 0)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--proto-dir", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
