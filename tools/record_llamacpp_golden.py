#!/usr/bin/env python3
"""Records llama.cpp's greedy continuations as a peer golden. Needs
`pip install llama-cpp-python` (which builds llama.cpp).

  --model default (SmolLM2): tests/golden/smollm2_q4_1_llamacpp.tsv
  --eval  (Qwen2.5-Coder-0.5B, scripts/fetch_model.sh --eval):
          tests/golden/qwen05b_llamacpp.tsv (3 prompts, one of ~2k tokens from the
          shared essays) and tests/golden/qwen05b_llamacpp_tokens.tsv (20 strings)

Prompts are tokenised by llama.cpp itself; each row stores the prompt ids, the
greedy ids and the top-1/top-2 logit margin of every step, so a test can tell a
real divergence from a near-tie. F32 KV cache (our engine's default), 2 threads."""
import argparse
import glob
import numpy as np
from llama_cpp import Llama

SMOLLM_PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]
QWEN_SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
TOKEN_STRINGS = [
    "Hello world", " Hello world", "hello  world\n\n", "The year 2024 had 366 days.", "naïve café résumé",
    "日本語のテキスト", "Привет, мир!", "emoji 🚀🔥 end", "def f(x):\n\treturn x ** 2", "   leading spaces",
    "trailing spaces   ", "<|im_start|>user\nhi<|im_end|>", "a" * 40, "1234567890", "don't won't it's",
    "C++20 std::span<int>", "https://example.com/a?b=c&d=e", "\n\n\n", "MiXeD CaSe WoRdS", "tab\tseparated\tvalues",
]


def escape(s):
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def essay_prompt(m, n_tokens):
    """A ~n_tokens chat prompt: the start of the shared essays, then a question."""
    text = "".join(open(p, encoding="utf-8").read() for p in sorted(glob.glob(
        "../shared/testdata/haystack/paul_graham_essays/*.txt"))[:8])
    ids = m.tokenize(text.encode(), add_bos=False, special=False)[:n_tokens]
    body = m.detokenize(ids).decode("utf-8", errors="ignore")
    return (QWEN_SYSTEM + "<|im_start|>user\n" + body +
            "\n\nIn one sentence, what is the text above about?<|im_end|>\n<|im_start|>assistant\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--eval", action="store_true", help="record the evaluation model's goldens")
    ap.add_argument("--model", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--n", type=int, default=32)
    args = ap.parse_args()
    import llama_cpp
    model = args.model or ("models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" if args.eval
                           else "models/SmolLM2-135M-Instruct.Q4_1.gguf")
    out = args.out or ("tests/golden/qwen05b_llamacpp.tsv" if args.eval else "tests/golden/smollm2_q4_1_llamacpp.tsv")
    # F32 KV cache (llama.cpp defaults to F16), as our engine keeps K and V in F32.
    m = Llama(model_path=model, n_ctx=4096 if args.eval else 512, n_threads=2, n_batch=512, logits_all=True,
              verbose=False, type_k=0, type_v=0)
    prompts = SMOLLM_PROMPTS
    if args.eval:
        prompts = [
            QWEN_SYSTEM + "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
            "def quicksort(arr):\n    \"\"\"Sort a list with quicksort.\"\"\"\n",
            essay_prompt(m, 2000),
        ]
    with open(out, "w") as f:
        f.write(f"# llama-cpp-python {llama_cpp.__version__}, {model}, greedy, F32 KV cache, 2 threads\n")
        f.write("prompt_escaped\tprompt_ids\tgen_ids\tmargins\n")
        for p in prompts:
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
            f.write(f"{escape(p)}\t{' '.join(map(str, ids))}\t{' '.join(map(str, gen))}\t"
                    f"{' '.join(f'{x:.4f}' for x in margins)}\n")
            print(f"{len(ids)} prompt tokens -> {m.detokenize(gen).decode(errors='replace')!r}")
    if args.eval:
        with open(out.replace(".tsv", "_tokens.tsv"), "w") as f:
            f.write(f"# llama-cpp-python {llama_cpp.__version__}, {model}: tokenize(text, add_bos=False, special=False)\n")
            f.write("text_escaped\tids\n")
            for s in TOKEN_STRINGS:
                f.write(f"{escape(s)}\t{' '.join(map(str, m.tokenize(s.encode(), add_bos=False, special=False)))}\n")


if __name__ == "__main__":
    main()
