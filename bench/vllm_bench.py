#!/usr/bin/env python3
"""vLLM CPU figures for ps_bench_engine's comparison (run through bench/vllm.sh, which
installs vLLM and sets its environment).

--model takes a Hugging Face folder, or a GGUF file, converted once to a BF16 folder next
to it (models/NAME-bf16: transformers' GGUF loader, then save_pretrained) that
pruneserve reads as well. Measures, on --threads cores, with the prompts cut from the
same text as ps_bench_engine's:
  prefill_N_tok_per_s      one request of N prompt tokens and one output token
  decode_tok_per_s         one request's generation after a 4-token prompt
  decode_at_D_tok_per_s    the same after a prompt of D tokens (--decode-depth)
  decode_S_streams_tok_per_s  S such requests at once, the aggregate
A decode rate counts the tokens after the first over the time between the first token
and the last, by vLLM's own per-request timestamps (its engine's first_token_ts and
last_token_ts): the steps alone, as ps_bench_engine times its own, with no prefill in them.
(Taking a prompt's one-token run off the whole request's time instead subtracts two
prefills of tens of seconds at depth 8k to leave a few seconds of decode: its noise
gave vLLM's decode at 8k more tokens a second than at depth 0 in one run.)
Prints one line per figure, `vllm NAME VALUE`, as ps_bench_engine names them (best of
--repeats runs, after one warm-up run of each shape)."""
import argparse
import glob
import os
import sys
import time


def bf16_folder(model):
    if os.path.isdir(model):
        return model
    out = os.path.splitext(model)[0] + "-bf16"
    if os.path.exists(os.path.join(out, "config.json")):
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    print(f"vllm_bench: converting {model} to a BF16 folder {out} (transformers' GGUF loader)", file=sys.stderr)
    folder, name = os.path.split(os.path.abspath(model))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    m = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    # The weights are dequantised tensors now; transformers still marks the model as
    # GGUF-quantised, which it refuses to save: a plain model of the same config instead.
    config = m.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    plain.load_state_dict(m.state_dict())
    plain.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def read_text(path):
    files = sorted(glob.glob(os.path.join(path, "*"))) if os.path.isdir(path) else [path]
    return "".join(open(f, encoding="utf-8", errors="replace").read() for f in files if os.path.isfile(f))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="Hugging Face folder or GGUF file")
    ap.add_argument("--text", default="../shared/testdata/haystack/paul_graham_essays")
    ap.add_argument("--prefill", type=int, nargs="*", default=[512, 2048])
    ap.add_argument("--decode", type=int, default=64, help="generated tokens per decode run")
    ap.add_argument("--decode-depth", type=int, nargs="*", default=[],
                    help="context depths (prompt tokens) at which one sequence's decode is also measured")
    ap.add_argument("--streams", type=int, default=16, help="requests decoding at once (0 = skip)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--convert-only", action="store_true", help="print the BF16 folder and stop")
    args = ap.parse_args()
    folder = bf16_folder(args.model)
    if args.convert_only:
        print(folder)
        return
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")  # GiB
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    # A prompt as long as the model's trained context (SmolLM2's 8,192) plus the generated token
    # passes it: only throughput is measured here, as pruneserve measures it.
    os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    longest = max(args.prefill + [d + args.decode for d in args.decode_depth] + [4 + args.decode])
    llm = LLM(model=folder, dtype="bfloat16", max_model_len=longest + 16, max_num_seqs=max(1, args.streams),
              max_num_batched_tokens=max(longest + 16, 2048), enable_prefix_caching=False,
              disable_log_stats=False)  # the per-request timestamps (RequestOutput.metrics)
    ids = llm.get_tokenizer().encode(read_text(args.text), add_special_tokens=False)

    def generate(prompts, out_tokens):
        sp = SamplingParams(temperature=0, max_tokens=out_tokens, min_tokens=out_tokens, ignore_eos=True)
        return llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)

    def seconds(prompts, out_tokens):
        generate(prompts, out_tokens)  # warm-up
        best = 1e30
        for _ in range(args.repeats):
            t = time.perf_counter()
            generate(prompts, out_tokens)
            best = min(best, time.perf_counter() - t)
        return best

    def decode_rate(prompts):
        """Aggregate tokens/s of the decode steps: every request's tokens after its first,
        from the last first token to the last token."""
        generate(prompts, args.decode)  # warm-up
        best = 0.0
        for _ in range(args.repeats):
            outs = generate(prompts, args.decode)
            if any(o.metrics is None or o.metrics.last_token_ts <= 0 for o in outs):
                sys.exit("vllm_bench.py: this vLLM gives no per-request timestamps (RequestOutput.metrics)")
            steps = max(o.metrics.last_token_ts for o in outs) - max(o.metrics.first_token_ts for o in outs)
            best = max(best, sum(len(o.outputs[0].token_ids) - 1 for o in outs) / steps)
        return best

    for n in args.prefill:
        print(f"vllm prefill_{n}_tok_per_s {n / seconds([ids[:n]], 1):.1f}", flush=True)
    if args.decode < 2:  # a decode rate is timed from the second token on
        return
    print(f"vllm decode_tok_per_s {decode_rate([ids[:4]]):.1f}", flush=True)
    for d in args.decode_depth:
        print(f"vllm decode_at_{d}_tok_per_s {decode_rate([ids[:d]]):.1f}", flush=True)
    if args.streams > 0:
        rate = decode_rate([ids[4 * s:4 * s + 4] for s in range(args.streams)])
        print(f"vllm decode_{args.streams}_streams_tok_per_s {rate:.1f}", flush=True)


if __name__ == "__main__":
    main()
