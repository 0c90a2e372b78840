#!/usr/bin/env python3
"""How far a KV cache's rounding moves a model's next-token distributions, with and
without the key shift (model/model.h's bk_shift: minus the k bias's RoPE rotations averaged
over the trained context), simulated in transformers on a Hugging Face folder in F32.

The cache types are rounded as pruneserve stores them: BF16 keys and values; Q8_0 blocks of
32 values (scale = largest / 127) for keys and values, and for the queries, as the int8
kernels quantise them. Prints, per variant, the mean and largest KL divergence of the last
--last positions' distributions from an F32 cache's, and how often their top tokens agree.

Needs torch and transformers: bench/vllm.sh's environment has both
(.cache/vllm/bin/python bench/kv_key_sim.py --model models/qwen2.5-coder-0.5b-instruct-q4_k_m-bf16).
"""
import argparse
import glob
import os

import torch
from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer
from transformers.integrations.sdpa_attention import sdpa_attention_forward


def q8(x):
    shape = x.shape
    x = x.reshape(*shape[:-1], -1, 32)
    scale = x.abs().amax(-1, keepdim=True) / 127
    return (torch.round(x / scale.clamp_min(1e-30)) * scale).reshape(shape)


def key_shifts(model):
    """Per layer, minus the mean over [0, n_ctx) of each KV head's rotated k bias (NeoX pairs)."""
    cfg = model.config
    theta = getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]
    hd = cfg.hidden_size // cfg.num_attention_heads
    inv = theta ** (-torch.arange(0, hd, 2).double() / hd)
    pos = torch.arange(cfg.max_position_embeddings).double()
    cos, sin = torch.cos(pos[:, None] * inv).mean(0), torch.sin(pos[:, None] * inv).mean(0)
    shifts = []
    for layer in model.model.layers:
        b = layer.self_attn.k_proj.bias
        if b is None:
            shifts.append(None)
            continue
        b = b.detach().double().view(-1, hd)
        b1, b2 = b[:, : hd // 2], b[:, hd // 2 :]
        mean = torch.cat([b1 * cos - b2 * sin, b2 * cos + b1 * sin], -1)
        shifts.append((-mean).float()[None, :, None, :])  # [1, kv heads, 1, hd]
    return shifts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="Hugging Face folder")
    ap.add_argument("--text", default=os.path.join(os.path.dirname(__file__), "../../shared/testdata/haystack/paul_graham_essays"),
                    help="folder of .txt files, read in reverse name order [default: the shared essays]")
    ap.add_argument("--tokens", type=int, default=4096, help="prompt length [default: 4096]")
    ap.add_argument("--last", type=int, default=512, help="positions compared [default: 512]")
    args = ap.parse_args()

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")
    text = "".join(open(f, errors="ignore").read() for f in sorted(glob.glob(os.path.join(args.text, "*.txt")))[::-1])
    ids = tok(text, return_tensors="pt").input_ids[:, : args.tokens]
    shifts = key_shifts(model)
    variant = "f32"

    def attention(module, query, key, value, attention_mask, **kw):
        s = shifts[module.layer_idx]
        if variant.endswith("+shift") and s is not None:
            key = key + s
        if variant.startswith("bf16"):
            key, value = key.bfloat16().float(), value.bfloat16().float()
        elif variant.startswith("q8_0"):
            key, value, query = q8(key), q8(value), q8(query)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)

    AttentionInterface.register("kv_key_sim", attention)
    model.config._attn_implementation = "kv_key_sim"
    base = None
    with torch.no_grad():
        for variant in ["f32", "bf16", "bf16+shift", "q8_0", "q8_0+shift"]:
            lp = model(ids).logits[0, -args.last :].log_softmax(-1)
            base = lp if base is None else base
            kl = (base.exp() * (base - lp)).sum(-1)
            agree = (base.argmax(-1) == lp.argmax(-1)).float().mean().item()
            print(f"{variant:11s} tokens {ids.shape[1]}: KL mean {kl.mean():.2e} max {kl.max():.2e}, top-1 agrees {agree:.1%}",
                  flush=True)


if __name__ == "__main__":
    main()
