#!/usr/bin/env python3
"""The OpenAI-compatible HTTP front, through the official `openai` Python client
(PyPI): completions and chat, whole and streamed (SSE, usage, logprobs, stop,
seed), the pruning extension, structured outputs (JSON schema samples judged by the
`jsonschema` package, json_object, vLLM's guided_grammar and guided_json), OpenAI-shaped 400/404 errors for bad input, and a
client that disconnects mid-stream, whose request must be cancelled and its KV
blocks freed. Greedy text must equal pruneserve-run's offline output."""
import argparse
import json
import os
import subprocess
import sys
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from serverproc import Server, wait_for  # noqa: E402

import openai  # noqa: E402

ARGS = None


class ServerCase(unittest.TestCase):
    """A server of ARGS.model with the HTTP front, and an `openai` client of it."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server(ARGS.server, ARGS.model, "--threads", "2", http=True)
        cls.addClassCleanup(cls.server.close)  # kills it if setUpClass fails past here
        cls.server.wait_serving_http()
        cls.client = openai.OpenAI(base_url=cls.server.http_url + "/v1", api_key="unused", max_retries=0,
                                   timeout=120)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        code, log = cls.server.stop()
        assert code == 0, f"server exited with {code}:\n{log}"

    def assert_error(self, exc_type, status, param, **kwargs):
        with self.assertRaises(exc_type) as cm:
            self.client.completions.create(**kwargs)
        self.assertEqual(cm.exception.status_code, status)
        body = cm.exception.body  # the "error" object
        self.assertIsInstance(body["message"], str)
        self.assertTrue(body["message"])
        self.assertEqual(body["param"], param, body)
        self.assertIn("type", body)
        return body


class OpenAIClientTest(ServerCase):
    def offline(self, prompt, n):
        return subprocess.run([ARGS.run, "--model", ARGS.model, "--prompt", prompt, "--max-new-tokens", str(n),
                               "--ignore-eos", "--threads", "1"],
                              check=True, capture_output=True, text=True).stdout[:-1]  # its newline

    def test_models_and_health(self):
        models = self.client.models.list().data
        self.assertEqual(len(models), 1)
        self.assertEqual(models[0].id, os.path.basename(ARGS.model).removesuffix(".gguf"))
        with urllib.request.urlopen(self.server.http_url + "/health", timeout=10) as r:
            self.assertEqual(r.status, 200)
        req = urllib.request.Request(self.server.http_url + "/v1/models", headers={"Accept-Encoding": "gzip, br"})
        with urllib.request.urlopen(req, timeout=10) as r:  # never compressed
            self.assertIsNone(r.headers.get("Content-Encoding"))
            self.assertEqual(json.loads(r.read())["data"][0]["id"], models[0].id)

    def test_completion_greedy_equals_offline_whole_and_streamed(self):
        prompt = "The capital of France is"
        want = self.offline(prompt, 12)
        whole = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=12, temperature=0,
                                               extra_body={"ignore_eos": True})
        self.assertEqual(whole.choices[0].text, want)
        self.assertEqual(whole.choices[0].finish_reason, "length")
        self.assertEqual(whole.usage.completion_tokens, 12)
        self.assertEqual(whole.usage.total_tokens, whole.usage.prompt_tokens + 12)
        chunks = list(self.client.completions.create(model=self.model, prompt=prompt, max_tokens=12, temperature=0,
                                                     stream=True, stream_options={"include_usage": True},
                                                     extra_body={"ignore_eos": True}))
        self.assertEqual("".join(c.choices[0].text for c in chunks if c.choices), want)
        self.assertEqual([c.choices[0].finish_reason for c in chunks if c.choices][-1], "length")
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 12)

    def test_chat_streamed_equals_whole_with_logprobs(self):
        messages = [{"role": "system", "content": "You are brief."},
                    {"role": "user", "content": "Name a colour."}]
        whole = self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=10, temperature=0,
                                                    logprobs=True, top_logprobs=3)
        choice = whole.choices[0]
        self.assertEqual(choice.message.role, "assistant")
        self.assertEqual(len(choice.logprobs.content), whole.usage.completion_tokens)
        for t in choice.logprobs.content:  # greedy: the sampled token is the most likely one
            self.assertEqual(len(t.top_logprobs), 3)
            self.assertAlmostEqual(t.logprob, t.top_logprobs[0].logprob, places=5)
            self.assertEqual(t.token, t.top_logprobs[0].token)
            self.assertEqual(bytes(t.bytes).decode(errors="replace"), t.token)
        stream = self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=10, temperature=0,
                                                     stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, choice.message.content)
        self.assertEqual([c.choices[0].finish_reason for c in chunks if c.choices][-1], choice.finish_reason)
        self.assertEqual(chunks[-1].usage.completion_tokens, whole.usage.completion_tokens)

    def test_n_choices_come_from_one_prompt(self):
        """n: 3 computes the prompt once (the metrics count it once) and returns 3 choices, whole or streamed
        under their index; completions' best_of returns the n most likely of best_of."""
        prompt = "The capital of France is"
        want = self.offline(prompt, 12)
        before = self.server.metric("pruneserve_prompt_tokens_total", strategy="full")
        before_requests = self.server.metric("pruneserve_requests_total", strategy="full")
        greedy = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=12, temperature=0, n=3,
                                                extra_body={"ignore_eos": True})
        self.assertEqual([c.index for c in greedy.choices], [0, 1, 2])
        self.assertEqual([c.text for c in greedy.choices], [want] * 3)
        self.assertEqual(greedy.usage.completion_tokens, 36)
        self.assertEqual(self.server.metric("pruneserve_prompt_tokens_total", strategy="full"),
                         before + greedy.usage.prompt_tokens)
        self.assertEqual(self.server.metric("pruneserve_requests_total", strategy="full"), before_requests + 1)

        sampled = dict(model=self.model, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=16,
                       temperature=1.0, seed=3, n=3)
        whole = self.client.chat.completions.create(**sampled)
        self.assertEqual([c.index for c in whole.choices], [0, 1, 2])
        texts = [c.message.content for c in whole.choices]
        self.assertGreater(len(set(texts)), 1, texts)  # each choice samples on its own
        streamed, finish, usage = {}, {}, None
        for chunk in self.client.chat.completions.create(**sampled, stream=True,
                                                         stream_options={"include_usage": True}):
            usage = chunk.usage or usage
            for c in chunk.choices:
                streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
                if c.finish_reason:
                    finish[c.index] = c.finish_reason
        self.assertEqual([streamed[i] for i in range(3)], texts)  # the same seed, the same choices
        self.assertEqual(sorted(finish), [0, 1, 2])
        self.assertEqual(usage.completion_tokens, whole.usage.completion_tokens)

        best = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=8, temperature=1.0, seed=5,
                                              n=2, best_of=4, logprobs=0, extra_body={"ignore_eos": True})
        self.assertEqual([c.index for c in best.choices], [0, 1])
        sums = [sum(c.logprobs.token_logprobs) for c in best.choices]
        self.assertGreaterEqual(sums[0], sums[1])  # most likely first
        self.assertEqual(best.usage.completion_tokens, 32)  # every generated choice's
        self.assert_error(openai.BadRequestError, 400, "best_of", model=self.model, prompt="a", n=3, best_of=2)

    def test_stop_seed_and_pruning(self):
        base = dict(model=self.model, prompt="1, 2, 3, 4, 5,", max_tokens=20, temperature=0)
        full = self.client.completions.create(**base).choices[0].text
        cut = full.find("7")
        self.assertGreater(cut, 0, full)
        stopped = self.client.completions.create(**base, stop=["7"]).choices[0]
        self.assertEqual(stopped.text, full[:cut])
        self.assertEqual(stopped.finish_reason, "stop")
        sampled = [self.client.completions.create(model=self.model, prompt="Once", max_tokens=8, temperature=1.0,
                                                  seed=1234).choices[0].text for _ in range(2)]
        self.assertEqual(sampled[0], sampled[1])
        before = self.server.metric("pruneserve_requests_total", strategy="lazyllm")
        pruned = self.client.completions.create(**base, extra_body={"pruning": {"strategy": "lazyllm",
                                                                                "layers": [10, 20],
                                                                                "keep": [1.0, 1.0]}})
        self.assertEqual(pruned.choices[0].text, full)  # keeping every token changes nothing
        self.assertEqual(self.server.metric("pruneserve_requests_total", strategy="lazyllm"), before + 1)

    def test_bad_inputs_get_openai_errors(self):
        m = self.model
        self.assert_error(openai.BadRequestError, 400, "temperature", model=m, prompt="a", temperature=-1)
        self.assert_error(openai.BadRequestError, 400, "top_p", model=m, prompt="a", top_p=1.5)
        self.assert_error(openai.BadRequestError, 400, "n", model=m, prompt="a", n=0)
        self.assert_error(openai.BadRequestError, 400, "max_tokens", model=m, prompt="a", max_tokens=0)
        self.assert_error(openai.BadRequestError, 400, "max_tokens", model=m, prompt="a", max_tokens=10 ** 7)
        self.assert_error(openai.BadRequestError, 400, "prompt", model=m, prompt="")
        self.assert_error(openai.BadRequestError, 400, "echo", model=m, prompt="a", echo=True)
        self.assert_error(openai.BadRequestError, 400, "bogus", model=m, prompt="a", extra_body={"bogus": 1})
        body = self.assert_error(openai.BadRequestError, 400, "pruning", model=m, prompt="a",
                                 extra_body={"pruning": {"strategy": "nope"}})
        self.assertIn("nope", body["message"])
        body = self.assert_error(openai.BadRequestError, 400, "pruning", model=m, prompt="a",
                                 extra_body={"pruning": {"strategy": "lazyllm", "layers": [10, 20], "keep": [0.5, 2]}})
        self.assertIn("keep", body["message"])
        body = self.assert_error(openai.NotFoundError, 404, "model", model="no-such-model", prompt="a")
        self.assertEqual(body["code"], "model_not_found")
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.chat.completions.create(model=m, messages=[{"role": "robot", "content": "x"}])
        self.assertEqual(cm.exception.body["param"], "messages[0].role")
        req = urllib.request.Request(self.server.http_url + "/v1/completions", data=b"{not json",
                                     headers={"Content-Type": "application/json"})
        with self.assertRaises(urllib.error.HTTPError) as cm:
            urllib.request.urlopen(req, timeout=10)
        self.assertEqual(cm.exception.code, 400)
        self.assertEqual(json.loads(cm.exception.read())["error"]["type"], "invalid_request_error")

    def test_disconnect_mid_stream_frees_the_request(self):
        before = self.server.metric("pruneserve_requests_total", finish_reason="cancelled")
        stream = self.client.chat.completions.create(model=self.model,
                                                     messages=[{"role": "user", "content": "Count to a million."}],
                                                     max_tokens=4000, temperature=0, stream=True,
                                                     extra_body={"ignore_eos": True})
        got = 0
        for chunk in stream:
            got += bool(chunk.choices and chunk.choices[0].delta.content)
            if got == 3:
                break
        self.assertEqual(self.server.metric("pruneserve_num_requests_running"), 1)
        stream.close()
        cancelled = wait_for(lambda: self.server.metric("pruneserve_requests_total", finish_reason="cancelled")
                             == before + 1, 30, step=0.05)
        self.assertTrue(cancelled, "the request was not cancelled")
        self.assertTrue(wait_for(lambda: self.server.request_blocks("device") == 0
                                 and self.server.metric("pruneserve_num_requests_running") == 0, 30, step=0.05))


# A test of its own: ThreadSanitizer's run leaves it out (tests/CMakeLists.txt label
# tsan_slow), as its mask walks and sampled answers there take many minutes.
class StructuredOutputsTest(ServerCase):
    # Bounded strings and arrays: every sample completes well within max_tokens.
    PERSON = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 8},
            "role": {"enum": ["admin", "user", "guest"]},
            "age": {"type": "integer", "minimum": 18, "maximum": 65},
            "pets": {"type": "array", "maxItems": 2, "items": {
                "type": "object", "properties": {"kind": {"enum": ["cat", "dog"]},
                                                 "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
                "required": ["kind"], "additionalProperties": False}},
            "nickname": {"type": ["string", "null"], "maxLength": 4},
        },
        "required": ["name", "role", "age"],
        "additionalProperties": False,
    }

    def test_structured_outputs_validate(self):
        import jsonschema
        messages = [{"role": "user", "content": "Describe a person as JSON."}]
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": self.PERSON, "strict": True}}
        for seed in range(6):
            r = self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=600,
                                                    temperature=0.8, seed=seed, response_format=fmt)
            self.assertEqual(r.choices[0].finish_reason, "stop", r.choices[0].message.content)
            jsonschema.validate(json.loads(r.choices[0].message.content), self.PERSON)
        # Streamed: the same text as whole, for the same seed.
        whole = self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=600,
                                                    temperature=0.8, seed=9, response_format=fmt)
        chunks = self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=600,
                                                     temperature=0.8, seed=9, response_format=fmt, stream=True)
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
                         whole.choices[0].message.content)
        # json_object, vLLM's guided_grammar and completions' guided_json.
        obj = self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=300, seed=1,
                                                  response_format={"type": "json_object"})
        if obj.choices[0].finish_reason == "stop":
            self.assertIsInstance(json.loads(obj.choices[0].message.content), dict)
        else:  # cut at max_tokens: still a prefix of an object
            self.assertTrue(obj.choices[0].message.content.lstrip().startswith("{"))
        yes_no = self.client.completions.create(model=self.model, prompt="Is the sky blue?", max_tokens=8,
                                                extra_body={"guided_grammar": 'root ::= " " ("yes" | "no") "."'})
        self.assertIn(yes_no.choices[0].text, (" yes.", " no."))
        self.assertEqual(yes_no.choices[0].finish_reason, "stop")
        # vLLM's guided_regex: the whole answer matches.
        date = self.client.completions.create(model=self.model, prompt="A date:", max_tokens=16, temperature=1.0,
                                              seed=4, extra_body={"guided_regex": " 20[0-9]{2}-(0[1-9]|1[0-2])"})
        self.assertRegex(date.choices[0].text, r"^ 20[0-9]{2}-(0[1-9]|1[0-2])$")
        self.assertEqual(date.choices[0].finish_reason, "stop")
        self.assert_error(openai.BadRequestError, 400, "guided_regex", model=self.model, prompt="a",
                          extra_body={"guided_regex": "(a"})
        # Each of n choices holds to the grammar (every fork walks it on its own).
        four = self.client.completions.create(model=self.model, prompt="Is the sky blue?", max_tokens=8, n=4,
                                              temperature=1.0, seed=2,
                                              extra_body={"guided_grammar": 'root ::= " " ("yes" | "no") "."'})
        self.assertEqual(len(four.choices), 4)
        for c in four.choices:
            self.assertIn(c.text, (" yes.", " no."))
            self.assertEqual(c.finish_reason, "stop")
        n = self.client.completions.create(model=self.model, prompt="Pick a number:", max_tokens=12,
                                           extra_body={"guided_json": {"type": "integer", "minimum": 3,
                                                                       "maximum": 7}})
        self.assertIn(int(n.choices[0].text), range(3, 8))
        # What cannot be honoured is a 400 naming it.
        body = self.assert_error(openai.BadRequestError, 400, "guided_json", model=self.model, prompt="a",
                                 extra_body={"guided_json": {"type": "string", "pattern": "(?=a)"}})
        self.assertIn("pattern", body["message"])
        body = self.assert_error(openai.BadRequestError, 400, "guided_grammar", model=self.model, prompt="a",
                                 extra_body={"guided_grammar": "root ::= item"})
        self.assertIn("'item' is used but not defined", body["message"])
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.chat.completions.create(model=self.model, messages=messages,
                                                response_format={"type": "json_schema", "json_schema": {"name": "x"}})
        self.assertEqual(cm.exception.body["param"], "response_format.json_schema.schema")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--model", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
