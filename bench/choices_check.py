#!/usr/bin/env python3
"""n > 1 against a running server (issue 33's check), with the `openai` client: a chat
request with n: 3 over a long prompt returns 3 choices from one prefill. The server's
metrics count its prompt tokens once (pruneserve_prompt_tokens_total and
..._computed_total grow by the prompt, not three times), the choices differ (each its
own seed stream), and the wall time is set beside one n: 1 request and three n: 1
requests one after the other, measured in the same run (each with a cache_salt of
its own, so no request reuses another's prompt from the prefix cache). Prints each check and the
times; exits 1 if a check failed.

Usage: choices_check.py --url http://127.0.0.1:8000 [--words 1500] [--max-tokens 32]"""
import argparse
import re
import sys
import time
import urllib.request

import openai
from checks import check, failed



def metric(url, name):
    """The sum of a counter's samples over its labels (strategies)."""
    page = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", page, re.M))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--words", type=int, default=1500, help="the document's length in words")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.url + "/v1", api_key="unused", max_retries=0, timeout=1200)
    model = client.models.list().data[0].id
    words = ("the quick brown fox jumps over the lazy dog while the river runs past the old mill " * 200).split()
    doc = " ".join((words * (args.words // len(words) + 1))[:args.words])
    messages = [{"role": "user", "content": doc + "\n\nInvent a short story inspired by this text."}]

    def ask(n, seed):
        t = time.perf_counter()
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=args.max_tokens,
                                           temperature=1.0, seed=seed, n=n,
                                           extra_body={"cache_salt": f"choices-check-{seed}-{time.time()}"})
        return r, time.perf_counter() - t

    ask(1, 0)  # warm-up
    one, t_one = ask(1, 1)
    three_seq = 0.0
    for seed in (2, 3, 4):
        three_seq += ask(1, seed)[1]
    prompt_before = metric(args.url, "pruneserve_prompt_tokens_total")
    computed_before = metric(args.url, "pruneserve_prompt_tokens_computed_total")
    three, t_three = ask(3, 5)
    prompt = three.usage.prompt_tokens
    check([c.index for c in three.choices] == [0, 1, 2], f"n: 3 returns 3 choices ({prompt} prompt tokens)")
    texts = [c.message.content for c in three.choices]
    check(len(set(texts)) > 1, f"the choices differ: {texts}")
    grew = metric(args.url, "pruneserve_prompt_tokens_total") - prompt_before
    computed = metric(args.url, "pruneserve_prompt_tokens_computed_total") - computed_before
    check(grew == prompt, f"pruneserve_prompt_tokens_total grew by {grew:.0f} = the prompt once")
    check(abs(computed - prompt) < 1e-6, f"pruneserve_prompt_tokens_computed_total grew by {computed:.0f}: one prefill")
    check(0 < three.usage.completion_tokens <= 3 * args.max_tokens,
          f"usage: {three.usage.completion_tokens} completion tokens over the 3 choices")
    print(f"wall time: n=1 {t_one:.2f} s ({one.usage.completion_tokens} tokens); n=3 {t_three:.2f} s "
          f"({three.usage.completion_tokens} tokens); three n=1 requests in a row {three_seq:.2f} s "
          f"(n=3 takes {t_three / three_seq:.2f}x their time)", flush=True)
    if failed:
        print(f"{len(failed)} check(s) failed", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
