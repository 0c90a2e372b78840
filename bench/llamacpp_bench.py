#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python) figures for the same file and thread count as
ps_bench_engine: prefill tokens/s for given prompt lengths (tokens of the same
text), and one sequence's decode tokens/s at given context depths.
Prints one line per figure: `llamacpp <name> <value>`, named as ps_bench_engine's."""
import argparse
import glob
import os
import time

from llama_cpp import Llama


def read_text(path):
    files = sorted(glob.glob(os.path.join(path, "*"))) if os.path.isdir(path) else [path]
    return "".join(open(f, encoding="utf-8", errors="replace").read() for f in files if os.path.isfile(f))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text", default="../shared/testdata/haystack/paul_graham_essays")
    ap.add_argument("--prefill", type=int, nargs="*", default=[512, 2048])
    ap.add_argument("--decode-depth", type=int, nargs="*", default=[0])
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    n_ctx = max(args.prefill + [d + args.decode for d in args.decode_depth] + [args.decode]) + 16
    # F32 KV cache (type 0), as ps_bench_engine's; llama.cpp's default is F16.
    m = Llama(model_path=args.model, n_ctx=n_ctx, n_batch=2048, n_ubatch=512, n_threads=args.threads,
              n_threads_batch=args.threads, type_k=0, type_v=0, verbose=False)
    ids_all = m.tokenize(read_text(args.text).encode(), add_bos=False, special=False)
    for n in args.prefill:
        best = 1e9
        for _ in range(args.repeats):
            m.reset()
            t = time.perf_counter()
            m.eval(ids_all[:n])
            best = min(best, time.perf_counter() - t)
        print(f"llamacpp prefill_{n}_tok_per_s {n / best:.1f}", flush=True)
    for depth in args.decode_depth:
        best = 1e9
        for _ in range(args.repeats if depth <= 512 else 1):
            m.reset()
            m.eval(ids_all[:max(depth, 4)])
            t = time.perf_counter()
            for i in range(args.decode):
                m.eval([(i * 31) % 1000 + 500])
            best = min(best, time.perf_counter() - t)
        name = "decode_tok_per_s" if depth == 0 else f"decode_at_{depth}_tok_per_s"
        print(f"llamacpp {name} {args.decode / best:.1f}", flush=True)


if __name__ == "__main__":
    main()
