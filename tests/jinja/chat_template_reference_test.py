#!/usr/bin/env python3
"""Our Jinja interpreter (jinja/template.h, through tests' jinja_render) against the
reference renderer, transformers' render_jinja_template (what apply_chat_template
calls), byte for byte: every template given (files, or the tokenizer.chat_template of
GGUF files) on a corpus of conversations (system or not, multi-turn, tools, tool
calls and their results, awkward text), with and without the generation prompt. A
conversation a template refuses (raise_exception) must be refused by both.

Usage: chat_template_reference_test.py JINJA_RENDER TEMPLATE_OR_GGUF_OR_FOLDER...
(a folder: its *.jinja files; scripts/fetch_model.sh --templates fills models/templates).
Exits non-zero listing every difference.
"""
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile

from transformers.utils import chat_template_utils as ctu

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}},
]


def call(name, args, id_="call_1"):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


CONVERSATIONS = {
    "user": ([{"role": "user", "content": "Hello!"}], None),
    "system_user": ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}], None),
    "multi_turn": ([
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"}], None),
    "ends_with_assistant": ([{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi!"}], None),
    "awkward_text": ([{"role": "user", "content": "  quotes ' \" \\ braces {{ x }} {% y %}\n\nünïcødé 数字 🙂\t "}],
                     None),
    "tools_offered": ([{"role": "user", "content": "Weather in Paris?"}], TOOLS),
    "tools_with_system": ([{"role": "system", "content": "Use tools."},
                           {"role": "user", "content": "Add 2 and 3."}], TOOLS),
    "tool_call_and_result": ([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21}"}], TOOLS),
    "parallel_tool_calls": ([
        {"role": "user", "content": "Add 1+2 and 3+4."},
        {"role": "assistant", "content": "", "tool_calls": [call("add", {"a": 1, "b": 2}, "call_1"),
                                                            call("add", {"a": 3, "b": 4}, "call_2")]},
        {"role": "tool", "tool_call_id": "call_1", "name": "add", "content": "3"},
        {"role": "tool", "tool_call_id": "call_2", "name": "add", "content": "7"},
        {"role": "assistant", "content": "3 and 7."},
        {"role": "user", "content": "Thanks"}], TOOLS),
    "string_arguments": ([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me check.",
         "tool_calls": [call("get_weather", "{\"city\": \"Oslo\", \"unit\": \"celsius\"}")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "cold"}], TOOLS),
    "two_systems_and_numbers": ([
        {"role": "system", "content": "First."}, {"role": "user", "content": "x"},
        {"role": "system", "content": "Second."}, {"role": "user", "content": "1.5e-7 and 10000000000000000.0"}], None),
}
SPECIAL = {"bos_token": "<BOS>", "eos_token": "<EOS>", "unk_token": "<UNK>", "pad_token": "<PAD>"}


def gguf_template(path):
    """tokenizer.chat_template of a GGUF file (None when absent)."""
    with open(path, "rb") as f:
        def u(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

        def string():
            return f.read(u("Q")).decode("utf-8")
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        u("I")
        u("Q")
        for _ in range(u("Q")):
            key, kind = string(), u("I")
            if kind == 8:
                value = string()
                if key == "tokenizer.chat_template":
                    return value
            elif kind == 9:
                item, n = u("I"), u("Q")
                if item == 8:
                    for _ in range(n):
                        string()
                else:
                    f.seek(sizes[item] * n, 1)
            else:
                f.seek(sizes[kind], 1)
    return None


def reference(template, messages, tools, add_generation_prompt):
    try:
        out, _ = ctu.render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                           add_generation_prompt=add_generation_prompt, **SPECIAL)
        return True, out[0]
    except Exception as e:  # a template's raise_exception, or another refusal
        return False, f"{type(e).__name__}: {e}"


def ours(render, template_path, messages, tools, add_generation_prompt):
    # The context the reference builds: its messages (reasoning fields aliased), tools
    # (None when absent), documents, the generation flag and the special tokens.
    chat = ctu._alias_reasoning_fields(ctu._plain_template_data(messages))
    context = {"messages": chat, "tools": tools, "documents": None, "add_generation_prompt": add_generation_prompt,
               **SPECIAL}
    p = subprocess.run([render, template_path], input=json.dumps(context, ensure_ascii=False).encode(),
                       capture_output=True, timeout=60)
    return p.returncode == 0, (p.stdout if p.returncode == 0 else p.stderr).decode()


def main():
    render, sources = sys.argv[1], []
    for arg in sys.argv[2:]:
        sources += sorted(glob.glob(os.path.join(arg, "*.jinja"))) if os.path.isdir(arg) else [arg]
    if not sources:
        print("no templates given (scripts/fetch_model.sh --templates fetches them)", file=sys.stderr)
        return 2
    failures, compared, refused = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for source in sources:
            if source.endswith(".gguf"):
                template = gguf_template(source)
                if template is None:
                    failures.append(f"{source}: no tokenizer.chat_template")
                    continue
                path = f"{tmp}/{len(failures)}-{compared}.jinja"
                with open(path, "w", encoding="utf-8") as f:
                    f.write(template)
            else:
                path = source
                with open(path, encoding="utf-8") as f:
                    template = f.read()
            for name, (messages, tools) in CONVERSATIONS.items():
                for agp in (True, False):
                    want_ok, want = reference(template, messages, tools, agp)
                    got_ok, got = ours(render, path, messages, tools, agp)
                    compared += 1
                    refused += not want_ok
                    label = f"{source} / {name} / add_generation_prompt={agp}"
                    if want_ok != got_ok:
                        failures.append(f"{label}: reference {'rendered' if want_ok else 'refused'} ({want[:300]!r}),"
                                        f" ours {'rendered' if got_ok else 'refused'} ({got[:300]!r})")
                    elif want_ok and want != got:
                        at = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
                        failures.append(f"{label}: differs at byte {at}:\n  reference {want[max(0, at - 60):at + 60]!r}"
                                        f"\n  ours      {got[max(0, at - 60):at + 60]!r}")
    for f in failures:
        print("FAIL", f)
    print(f"{compared} renderings compared over {len(sources)} templates ({refused} refused by the reference too):"
          f" {len(failures)} differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
