#!/usr/bin/env python3
"""pruneserve-loadtest against a real server on loopback: its JSON's counts add
up (sent = completed + cancelled + failed, per strategy too), its totals match the
server's counters, its TTFT percentiles fall within the server's TTFT histogram
buckets of the same ranks, a run with client cancels and deadlines leaves no request
running and no KV block used, and a sweep's JSON plots (loadtest/plot.py)."""
import argparse
import bisect
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from serverproc import Server, wait_for  # noqa: E402

ARGS = None
# What the client adds to a request's time to the first token, at most, on this test's load (its own
# and gRPC's time: a few milliseconds, tens on a machine busy with other work).
CLIENT_OVERHEAD_S = 0.1


def histogram(server, name):
    """(bucket upper bounds, cumulative counts) of a histogram summed over its labels."""
    buckets = {}
    for (n, labels), v in server.metrics().items():
        if n == name + "_bucket":
            le = float(dict(labels)["le"])
            buckets[le] = buckets.get(le, 0) + v
    bounds = sorted(buckets)
    return bounds, [buckets[b] for b in bounds]


def rank_bucket(counts, rank):
    """Index of the histogram bucket that holds the rank-th smallest observation (1-based)."""
    return bisect.bisect_left(counts, rank)


class LoadtestServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(ARGS.server, ARGS.model, "--threads", "2")
        cls.addClassCleanup(cls.server.close)  # kills it if setUpClass fails past here
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        code, log = cls.server.stop()
        cls.tmp.cleanup()
        assert code == 0, f"server exited with {code}:\n{log}"

    def loadtest(self, name, *args):
        out = os.path.join(self.tmp.name, name + ".json")
        p = subprocess.run([ARGS.loadtest, "--addr", self.server.grpc_addr, "--haystack", ARGS.haystack,
                            "--result-file", out, "--progress", "off", *args], capture_output=True, text=True,
                           timeout=600)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("Serving Benchmark Result", p.stdout)
        with open(out) as f:
            return json.load(f)

    def assert_counts_add_up(self, run, sent):
        self.assertEqual(run["sent"], sent)
        self.assertEqual(run["completed"] + run["cancelled"] + run["failed"], run["sent"])
        per = run["per_strategy"].values()
        for key in ("sent", "completed", "cancelled", "failed"):
            self.assertEqual(sum(s[key] for s in per), run[key], key)

    def test_1_counts_totals_and_ttft_agree_with_the_server(self):
        result = self.loadtest("clean", "--num-requests", "40", "--request-rate", "40", "--max-concurrency", "8",
                               "--input-len", "64", "--output-len", "12", "--strategy-mix", "full=1,lazyllm=1",
                               "--seed", "3")
        run = result["runs"][0]
        self.assert_counts_add_up(run, 40)
        self.assertEqual(run["completed"], 40, run["failures"])
        self.assertEqual(set(run["per_strategy"]), {"full", "lazyllm"})
        self.assertEqual(run["total_input_tokens"], 40 * 64)
        self.assertEqual(run["total_output_tokens"], 40 * 12)
        self.assertGreater(run["request_throughput"], 0)
        self.assertEqual(self.server.metric("pruneserve_requests_total"), 40)
        self.assertEqual(self.server.metric("pruneserve_generation_tokens_total"), 40 * 12)
        self.assertEqual(self.server.metric("pruneserve_prompt_tokens_total"), 40 * 64)
        for strategy, s in run["per_strategy"].items():
            self.assertEqual(self.server.metric("pruneserve_requests_total", strategy=strategy), s["completed"])
        bounds, counts = histogram(self.server, "pruneserve_time_to_first_token_seconds")
        self.assertEqual(counts[-1], 40)
        n = counts[-1]
        for q, key in ((0.5, "median_ttft_ms"), (0.9, "p90_ttft_ms")):
            client_q = run[key] / 1e3
            # The client's percentile lies between its observations of ranks r and r + 1 (numpy's
            # linear rule). Each request's first token comes no later at the server than at the
            # client, which adds its own time and the network's (at most CLIENT_OVERHEAD_S): so the
            # percentile is no lower than the server's bucket of rank r begins, and no higher than
            # its bucket of rank r + 1 ends plus that overhead, whatever the machine's load. (An
            # interpolation inside a bucket, like Prometheus' histogram_quantile, is no bound.)
            r = math.floor(q * (n - 1)) + 1
            lo_bucket, hi_bucket = rank_bucket(counts, r), rank_bucket(counts, min(r + 1, n))
            lower = 0.0 if lo_bucket == 0 else bounds[lo_bucket - 1]
            upper = bounds[hi_bucket]
            what = f"q={q}: client {client_q:.4f} s, server buckets ({lower}, {upper}], all {bounds}"
            self.assertGreaterEqual(client_q, lower, what)
            self.assertLess(client_q, upper + CLIENT_OVERHEAD_S, what)

    def test_2_cancels_and_deadlines_are_counted_and_free_everything(self):
        # 400 tokens a request: hundreds of engine steps, far more than the 50 ms within which the cancels come.
        result = self.loadtest("cancels", "--num-requests", "60", "--request-rate", "100", "--input-len", "32",
                               "--output-len", "400", "--cancel-fraction", "0.3", "--cancel-within", "0.05",
                               "--deadline-fraction", "0.2", "--deadline", "0.03",
                               "--strategy-mix", "full=2,gemfilter=1,critiprefill=1", "--seed", "5")
        run = result["runs"][0]
        self.assert_counts_add_up(run, 60)
        self.assertEqual(run["failed"], 0, run["failures"])
        self.assertGreater(run["cancelled"], 0)
        self.assertGreater(run["completed"], 0)
        self.assertTrue(wait_for(lambda: self.server.metric("pruneserve_num_requests_running") == 0
                                 and self.server.metric("pruneserve_num_requests_waiting") == 0
                                 and self.server.request_blocks("device") == 0,
                                 30, step=0.05))

    def test_3_a_sweep_writes_one_run_per_rate(self):
        result = self.loadtest("sweep", "--num-requests", "6", "--sweep-rates", "5,inf", "--input-len", "16",
                               "--output-len", "4")
        self.assertEqual([r["request_rate"] for r in result["runs"]], [5, "inf"])
        for r in result["runs"]:
            self.assert_counts_add_up(r, 6)
        png = os.path.join(self.tmp.name, "sweep.png")
        subprocess.run([sys.executable, ARGS.plot, os.path.join(self.tmp.name, "sweep.json") + ":test", "-o", png],
                       check=True, capture_output=True, timeout=120)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--loadtest", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--haystack", required=True)
    ap.add_argument("--plot", required=True, help="loadtest/plot.py")
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
