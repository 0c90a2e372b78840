#!/usr/bin/env python3
"""Records gguf's Python dequantisation (the `gguf` package from PyPI, independent of
llama.cpp's C code and of ours) as a golden for tests/kernels/quant_golden_test.cc:

  tests/golden/gguf_dequant_random.tsv  random blocks of every supported block type
  tests/golden/gguf_dequant_eval.tsv    the first row of the first tensor of each block
                                        type in the evaluation model (scripts/fetch_model.sh --eval)

Each row: type, tensor name (or "-"), the raw block bytes in hex (random rows only),
and the dequantised values as float32 bit patterns in hex.
Run: pip install gguf numpy; python3 tools/record_gguf_dequant_golden.py"""
import argparse
import numpy as np
from gguf import GGMLQuantizationType as T, GGUFReader
from gguf.quants import dequantize

TYPES = {T.Q4_0: (32, 18, [0]), T.Q4_1: (32, 20, [0, 2]), T.Q5_0: (32, 22, [0]), T.Q5_1: (32, 24, [0, 2]),
         T.Q8_0: (32, 34, [0]), T.Q2_K: (256, 84, [80, 82]), T.Q3_K: (256, 110, [108]),
         T.Q4_K: (256, 144, [0, 2]), T.Q5_K: (256, 176, [0, 2]), T.Q6_K: (256, 210, [208])}


def hexfloats(v):
    return " ".join(f"{x:08x}" for x in np.asarray(v, dtype=np.float32).view(np.uint32))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--eval-model", default="models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--out-dir", default="tests/golden")
    args = ap.parse_args()
    rng = np.random.default_rng(1234)
    with open(f"{args.out_dir}/gguf_dequant_random.tsv", "w") as f:
        f.write("# gguf.quants.dequantize on random blocks (fp16 scales in [-0.05, 0.05])\n")
        f.write("type\ttensor\tblocks_hex\tvalues_f32_hex\n")
        for t, (elems, size, halves) in TYPES.items():
            for blocks in (1, 3):
                raw = rng.integers(0, 256, size=blocks * size, dtype=np.uint8)
                for b in range(blocks):
                    for off in halves:
                        h = np.array([rng.uniform(-0.05, 0.05)], dtype=np.float16).view(np.uint8)
                        raw[b * size + off:b * size + off + 2] = h
                vals = dequantize(raw, t).reshape(-1)
                assert vals.size == blocks * elems
                f.write(f"{t.name}\t-\t{raw.tobytes().hex()}\t{hexfloats(vals)}\n")
    reader = GGUFReader(args.eval_model)
    seen = set()
    with open(f"{args.out_dir}/gguf_dequant_eval.tsv", "w") as f:
        f.write(f"# gguf.quants.dequantize, row 0 of the first tensor of each type in {args.eval_model}\n")
        f.write("type\ttensor\tblocks_hex\tvalues_f32_hex\n")
        for t in reader.tensors:
            if t.tensor_type in seen or t.tensor_type not in TYPES:
                continue
            seen.add(t.tensor_type)
            row = np.asarray(t.data)[0] if t.data.ndim > 1 else np.asarray(t.data)
            vals = dequantize(np.ascontiguousarray(row), t.tensor_type).reshape(-1)
            f.write(f"{t.tensor_type.name}\t{t.name}\t-\t{hexfloats(vals)}\n")
            print(t.tensor_type.name, t.name, vals.size)


if __name__ == "__main__":
    main()
