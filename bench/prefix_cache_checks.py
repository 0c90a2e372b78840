#!/usr/bin/python3
"""The prefix cache's must-hold checks on a real model (issue 32; the 0.5B evaluation
model by default), each printed with its figures and PASS / FAIL, exit status 1 on a
failure. Timing ratios come from one run on one machine: run it on a quiet one.

  1. A document of --doc-tokens tokens asked four questions in turn (greedy): turns
     2-4 take <= 1/10 of turn 1's TTFT, report >= doc-tokens - 100 cached tokens and
     give exactly the tokens of a server with --prefix-cache off.
  2. A device tier that holds one such request: a second document moves the first to
     the host tier; the first document's next question hits there (the metrics say
     so), gives the same tokens, and its TTFT is <= 1/4 of a cold prefill.
  3. Two API keys: the second key's first request over the same document gets 0
     cached tokens.

Usage: bench/prefix_cache_checks.py [--model M] [--doc-tokens 7000] [--server build/pruneserve]
"""
import argparse
import glob
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "pyutil"))
from grpcstubs import generate_stubs  # noqa: E402
from serverproc import Server, wait_for  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
QUESTIONS = ["What is the main argument of the text above?", "Which people does the text name?",
             "Summarise the last paragraph in one sentence.", "What advice does the author give?"]
failures = []


def check(name, ok, figures):
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {figures}", flush=True)
    if not ok:
        failures.append(name)


class Client:
    def __init__(self, server, key=None):
        self.server = server
        self.channel = grpc.insecure_channel(server.grpc_addr)
        self.stub = pb_grpc.GenerationStub(self.channel)
        self.metadata = (("authorization", f"Bearer {key}"),) if key else ()
        assert wait_for(self.loaded, 300, step=0.2), f"the model did not load:\n{server.read_log()}"

    def loaded(self):
        try:
            self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=1, metadata=self.metadata)
            return True
        except grpc.RpcError:
            return False

    def tokenize(self, text):
        return list(self.stub.Tokenize(pb.TokenizeRequest(text=text, add_special_tokens=False),
                                       metadata=self.metadata).token_ids)

    def ask(self, ids, n=16):
        """(tokens, ttft seconds, cached tokens) of a greedy request."""
        req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), sampling=pb.SamplingParams(temperature=0.0),
                                 stopping=pb.StoppingCriteria(max_new_tokens=n, ignore_eos=True))
        tokens, usage = [], None
        for ev in self.stub.Generate(req, timeout=900, metadata=self.metadata):
            if ev.HasField("chunk"):
                tokens += list(ev.chunk.token_ids)
            elif ev.HasField("finished"):
                usage = ev.finished.usage
        return tokens, usage.time_to_first_token_seconds, usage.cached_tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--server", default=os.path.join(ROOT, "build/pruneserve"))
    ap.add_argument("--haystack", default=os.path.join(ROOT, "../shared/testdata/haystack/paul_graham_essays"))
    ap.add_argument("--doc-tokens", type=int, default=7000)
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    generate_stubs(os.path.join(ROOT, "proto"), tmp.name)
    global grpc, pb, pb_grpc
    import grpc
    from pruneserve.v1 import generation_pb2 as pb
    from pruneserve.v1 import generation_pb2_grpc as pb_grpc

    text = "".join(open(f, encoding="utf-8", errors="replace").read()
                   for f in sorted(glob.glob(os.path.join(args.haystack, "*"))))
    common = ["--log-level", "warn", "--prefill-chunk", "65536", "--max-batch-tokens", "65536"]

    # 1. Four questions in turn, cache on, then the same requests with the cache off.
    on = Server(args.server, args.model, *common)
    c = Client(on)
    ids = c.tokenize(text)
    docs = [ids[:args.doc_tokens], ids[args.doc_tokens:2 * args.doc_tokens]]
    prompts = [docs[0] + c.tokenize("\n\n" + q + "\n") for q in QUESTIONS]
    turns = [c.ask(p) for p in prompts]
    on.stop()
    off = Server(args.server, args.model, *common, "--prefix-cache", "off")
    c = Client(off)
    reference = [c.ask(p)[0] for p in prompts]
    off.stop()
    cold = turns[0][1]
    for i, (tokens, ttft, cached) in enumerate(turns[1:], start=2):
        check(f"turn {i}: TTFT <= 1/10 of turn 1", ttft <= cold / 10, f"{ttft:.3f} s vs {cold:.2f} s ({cold / ttft:.0f}x)")
        check(f"turn {i}: >= {args.doc_tokens - 100} cached tokens", cached >= args.doc_tokens - 100,
              f"{cached} of {len(prompts[i - 1])}")
    for i, (got, want) in enumerate(zip((t[0] for t in turns), reference), start=1):
        check(f"turn {i}: the tokens of --prefix-cache off", got == want, f"{got[:8]}... vs {want[:8]}...")

    # 2. and 3. A device tier that holds one document's request, two API keys.
    keys = os.path.join(tmp.name, "keys")
    with open(keys, "w") as f:
        f.write("key-a\nkey-b\n")
    # The tight tier is sized from the server's own capacity figure.
    probe = Server(args.server, args.model, *common, "--kv-device-bytes", str(1 << 30))
    pc = Client(probe)
    load = pc.stub.GetLoad(pb.GetLoadRequest())
    kv_token_bytes = (1 << 30) / load.kv[0].capacity_tokens
    probe.stop()
    one = int(kv_token_bytes * (len(prompts[0]) + 16) * 1.3)  # one request and a little
    tight = Server(args.server, args.model, *common, "--kv-device-bytes", str(one), "--api-key-file", keys)
    a = Client(tight, "key-a")
    first_cold = a.ask(prompts[0])[1]
    a.ask(docs[1] + a.tokenize("\n\n" + QUESTIONS[0] + "\n"))  # the second document: the first's pages go to the host
    moved = tight.metric("pruneserve_prefix_cache_evicted_blocks_total", to="host")
    check("a second document moves the first to the host tier", moved > 0, f"{moved:.0f} blocks moved")
    waited = tight.metric("pruneserve_kv_move_wait_seconds_total")
    brought = tight.metric("pruneserve_kv_swap_bytes_total", direction="to_device")
    tokens, ttft, cached = a.ask(prompts[1])
    waited = tight.metric("pruneserve_kv_move_wait_seconds_total") - waited
    brought = tight.metric("pruneserve_kv_swap_bytes_total", direction="to_device") - brought
    print(f"      its host-tier pages came back as {brought / 2**20:.1f} MiB of copies overlapped with the prefill of"
          f" the rest, which waited {waited * 1000:.1f} ms for them", flush=True)
    host_hits = tight.metric("pruneserve_prefix_cache_hit_tokens_total", tier="host")
    check("the first document's next question hits in the host tier", host_hits > 0 and cached > 0,
          f"{cached} cached tokens, {host_hits:.0f} of them from the host tier (metrics)")
    check("the host-tier hit gives the tokens of --prefix-cache off", tokens == reference[1], f"{tokens[:8]}...")
    check("the host-tier hit's TTFT <= 1/4 of a cold prefill", ttft <= first_cold / 4,
          f"{ttft:.2f} s vs {first_cold:.2f} s ({first_cold / ttft:.1f}x)")
    b = Client(tight, "key-b")
    tokens, _, cached = b.ask(prompts[2])
    check("another API key's first request over the document: 0 cached", cached == 0, f"{cached} cached")
    check("... with the tokens of --prefix-cache off", tokens == reference[2], f"{tokens[:8]}...")
    tight.stop()
    print("all checks passed" if not failures else f"{len(failures)} checks failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
