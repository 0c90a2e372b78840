#!/usr/bin/env python3
"""Structured outputs against a running server (issue 33's check): N chat answers at
temperature 0.8 to a nested JSON schema (an object with an enum, an integer range, an
array of objects, required and optional properties), each judged by the `jsonschema`
package. Prints one line per answer and the count that parse and validate; exits 1
unless all do.

Usage: structured_outputs_check.py --url http://127.0.0.1:8000 [--samples 20]
(the venv of scripts/setup.sh has openai and jsonschema)."""
import argparse
import json
import sys
import time

import jsonschema
import openai

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "role": {"enum": ["admin", "user", "guest"]},
        "age": {"type": "integer", "minimum": 18, "maximum": 65},
        "pets": {"type": "array", "items": {
            "type": "object",
            "properties": {"kind": {"enum": ["cat", "dog", "fish"]}, "name": {"type": "string"}},
            "required": ["kind"]}},
        "email": {"type": "string"},
    },
    "required": ["name", "role", "age", "pets"],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the server's HTTP address (--http-port)")
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=400)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    fmt = {"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA, "strict": True}}
    valid, t0 = 0, time.time()
    for seed in range(args.samples):
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Invent a user of our site with their pets, as JSON."}],
            max_tokens=args.max_tokens, temperature=0.8, seed=seed, response_format=fmt)
        text = r.choices[0].message.content
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
            valid += 1
            verdict = "valid"
        except (ValueError, jsonschema.ValidationError) as e:
            verdict = f"INVALID ({type(e).__name__}: {str(e)[:80]})"
        print(seed, r.choices[0].finish_reason, r.usage.completion_tokens, verdict, json.dumps(text)[:120], flush=True)
    print(f"{model}: {valid}/{args.samples} parse and validate ({time.time() - t0:.0f} s)")
    return 0 if valid == args.samples else 1


if __name__ == "__main__":
    sys.exit(main())
