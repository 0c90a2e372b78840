#!/usr/bin/env python3
"""Records llama.cpp's greedy continuations of the default model as a peer golden
(tests/golden/smollm2_q4_1_llamacpp.tsv). Needs `pip install llama-cpp-python`.

Prompts are tokenised by llama.cpp itself; each row stores the prompt ids, the
greedy ids and the top-1/top-2 logit margin of every step, so a test can tell a
real divergence from a near-tie."""
import argparse
import numpy as np
from llama_cpp import Llama

PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="tests/golden/smollm2_q4_1_llamacpp.tsv")
    ap.add_argument("--n", type=int, default=32)
    args = ap.parse_args()
    import llama_cpp
    # F32 KV cache (llama.cpp defaults to F16), as our engine keeps K and V in F32.
    m = Llama(model_path=args.model, n_ctx=512, n_threads=2, n_batch=512, logits_all=True, verbose=False,
              type_k=0, type_v=0)
    with open(args.out, "w") as f:
        f.write(f"# llama-cpp-python {llama_cpp.__version__}, {args.model}, greedy, F32 KV cache, 2 threads\n")
        f.write("prompt_escaped\tprompt_ids\tgen_ids\tmargins\n")
        for p in PROMPTS:
            ids = m.tokenize(p.encode(), add_bos=False, special=True)
            m.reset()
            m.eval(ids)
            gen, margins = [], []
            for _ in range(args.n):
                logits = np.array(m.scores[m.n_tokens - 1], dtype=np.float64)
                top2 = np.argsort(-logits)[:2]
                gen.append(int(top2[0]))
                margins.append(float(logits[top2[0]] - logits[top2[1]]))
                m.eval([gen[-1]])
            esc = p.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
            f.write(f"{esc}\t{' '.join(map(str, ids))}\t{' '.join(map(str, gen))}\t{' '.join(f'{x:.4f}' for x in margins)}\n")

if __name__ == "__main__":
    main()
