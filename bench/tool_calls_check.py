#!/usr/bin/env python3
"""Tool calling against a running server (issue 33's check), with the `openai` client:
tool_choice "required" with two tools gives calls whose arguments validate against the
tool's parameters (`jsonschema`); "auto" with a question one tool answers gives that
call; the conversation continues with a `tool` message and the answer uses the result;
streaming gives the same calls; a named function is the one called. Prints each check;
exits 1 if any failed.

Usage: tool_calls_check.py --url http://127.0.0.1:8000"""
import argparse
import json
import sys

import jsonschema
import openai
from checks import check, failed

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
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}




def validate(calls):
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), PARAMS[c.function.name])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    ask = lambda messages, **kw: client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                                                max_tokens=200, temperature=0, **kw)
    weather_q = [{"role": "user", "content": "What is the weather in Paris right now?"}]

    r = ask([{"role": "user", "content": "Hello! What can you do?"}], tool_choice="required")
    m = r.choices[0].message
    check(r.choices[0].finish_reason == "tool_calls" and m.tool_calls, f"required: calls {m.tool_calls}")
    validate(m.tool_calls)
    check(True, "required: the arguments validate against the tools' parameters")

    r = ask(weather_q, tool_choice="auto")
    m = r.choices[0].message
    if not check(bool(m.tool_calls) and m.tool_calls[0].function.name == "get_weather",
                 f"auto: {m.tool_calls[0].function.name if m.tool_calls else m.content!r}"):
        return 1
    validate(m.tool_calls)
    args0 = json.loads(m.tool_calls[0].function.arguments)
    check("paris" in args0.get("city", "").lower(), f"auto: arguments {args0}")

    chunks = list(ask(weather_q, tool_choice="auto", stream=True))
    streamed = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    check([(t.function.name, t.function.arguments) for t in streamed] ==
          [(t.function.name, t.function.arguments) for t in m.tool_calls], "streaming gives the same calls")
    check([c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls", "streaming: finish tool_calls")

    follow = weather_q + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": m.tool_calls[0].id, "type": "function",
             "function": {"name": "get_weather", "arguments": m.tool_calls[0].function.arguments}}]},
        {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "{\"temperature\": 23, \"sky\": \"sunny\"}"}]
    r = ask(follow, tool_choice="auto")
    text = r.choices[0].message.content or ""
    check(("23" in text or "sunny" in text.lower()) and not r.choices[0].message.tool_calls,
          f"the answer uses the result: {text[:160]!r}")

    r = ask([{"role": "user", "content": "What is 17 plus 25?"}],
            tool_choice={"type": "function", "function": {"name": "add"}})
    calls = r.choices[0].message.tool_calls
    check(bool(calls) and all(c.function.name == "add" for c in calls), f"named: {calls}")
    validate(calls)
    print(f"{model}: {'all tool-call checks pass' if not failed else f'{len(failed)} failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
