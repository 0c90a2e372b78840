#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python) figures for the same file and thread count as
ps_bench_engine: prefill tokens/s for given prompt lengths and decode tokens/s.
Prints one line per figure: `llamacpp <name> <value>`."""
import argparse
import time

from llama_cpp import Llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, nargs="*", default=[512, 2048])
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    n_ctx = max(args.prefill + [args.decode]) + args.decode + 8
    m = Llama(model_path=args.model, n_ctx=n_ctx, n_batch=2048, n_ubatch=512, n_threads=args.threads,
              n_threads_batch=args.threads, verbose=False)
    vocab = m.n_vocab()
    for n in args.prefill:
        ids = [(i * 7919) % (vocab - 1000) + 500 for i in range(n)]
        best = 1e9
        for _ in range(args.repeats):
            m.reset()
            t = time.perf_counter()
            m.eval(ids)
            best = min(best, time.perf_counter() - t)
        print(f"llamacpp prefill_{n}_tok_per_s {n / best:.1f}", flush=True)
    best = 1e9
    for _ in range(args.repeats):
        m.reset()
        m.eval([1, 2, 3, 4])
        t = time.perf_counter()
        for i in range(args.decode):
            m.eval([(i * 31) % 1000 + 500])
        best = min(best, time.perf_counter() - t)
    print(f"llamacpp decode_tok_per_s {args.decode / best:.1f}", flush=True)


if __name__ == "__main__":
    main()
