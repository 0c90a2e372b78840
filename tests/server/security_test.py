#!/usr/bin/env python3
"""TLS, API keys and request limits through independent clients: Debian's
python3-grpcio and the official `openai` client (PyPI). No token or a wrong one is
rejected (UNAUTHENTICATED / 401), the right one is served, plaintext to a TLS port
is refused, client certificates are required under mutual TLS, health and metrics
stay open; requests beyond the operator's limits get RESOURCE_EXHAUSTED (HTTP 400
naming the field, 413 for a body, 429 for streams), and a client that stops
reading its stream loses that request only."""
import argparse
import http.client
import json
import os
import ssl
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from grpcstubs import run_tests, wait_loaded  # noqa: E402
from serverproc import Server, wait_for  # noqa: E402


import openai  # noqa: E402

ARGS = None
KEY = "ps-test-key-0123456789abcdef"
PKI = None  # {name: path}


def make_pki(d):
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate it
    signed and a self-signed (rogue) client certificate, with openssl."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=pruneserve test CA")
    for name, ext in (("server", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write(ext)
        run("req", *ec, "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name)
        run("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", name + ".crt", "-days", "2", "-extfile", name + ".ext")
    run("req", "-x509", *ec, "-keyout", "rogue.key", "-out", "rogue.crt", "-days", "2", "-subj", "/CN=rogue")
    with open(os.path.join(d, "keys"), "w") as f:
        f.write("# API keys\n\n" + KEY + "\nold-key-being-rotated-out\n")
    with open(os.path.join(d, "prompts"), "w") as f:  # for pruneserve-loadtest
        f.write('{"prompt": "Once upon a time", "max_tokens": 8}\n')
    return {"dir": d, **{n: os.path.join(d, n) for n in os.listdir(d)}}


def read(path):
    with open(path, "rb") as f:
        return f.read()


def grpc_channel(addr, client_cert=None):
    """A TLS channel trusting the test CA, with `client_cert` ("client" / "rogue") if given."""
    key = read(PKI[client_cert + ".key"]) if client_cert else None
    chain = read(PKI[client_cert + ".crt"]) if client_cert else None
    creds = grpc.ssl_channel_credentials(root_certificates=read(PKI["ca.crt"]), private_key=key,
                                         certificate_chain=chain)
    return grpc.secure_channel(addr, creds)


def health(channel):
    """grpc.health.v1.Health/Check for the whole server, without stubs: b'\\x08\\x01' is SERVING."""
    return channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=10)


def token(key):
    return (("authorization", "Bearer " + key),)




def generate(stub, text="Once upon a time", n=8, metadata=(), **kw):
    req = pb.GenerateRequest(text=text, sampling=pb.SamplingParams(temperature=0.0),
                             stopping=pb.StoppingCriteria(max_new_tokens=n, ignore_eos=True, **kw))
    events = list(stub.Generate(req, timeout=60, metadata=metadata))
    assert events[-1].HasField("finished"), events[-1]
    return [t for e in events if e.HasField("chunk") for t in e.chunk.token_ids]


class TlsAndTokenTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ctx = ssl.create_default_context(cafile=PKI["ca.crt"])
        cls.server = Server(ARGS.server, ARGS.model, "--threads", "1", "--tls-cert", PKI["server.crt"],
                            "--tls-key", PKI["server.key"], "--api-key-file", PKI["keys"], http=True,
                            ssl_context=cls.ctx)
        cls.addClassCleanup(cls.server.close)  # kills it if setUpClass fails past here
        cls.channel = grpc_channel(cls.server.grpc_addr)
        cls.stub = pb_grpc.GenerationStub(cls.channel)
        wait_loaded(cls.stub, token(KEY))
        cls.server.wait_serving_http()

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        code, log = cls.server.stop()
        assert code == 0, f"server exited with {code}:\n{log}"

    def test_grpc_token(self):
        for metadata in ((), token("wrong-key"), token(KEY + "x"), token(KEY[:-1]), (("authorization", KEY),)):
            for call in (lambda: generate(self.stub, metadata=metadata),
                         lambda: self.stub.Tokenize(pb.TokenizeRequest(text="hi"), timeout=10, metadata=metadata),
                         lambda: self.stub.GetLoad(pb.GetLoadRequest(), timeout=10, metadata=metadata)):
                with self.assertRaises(grpc.RpcError) as e:
                    call()
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED, metadata)
        self.assertEqual(len(generate(self.stub, metadata=token(KEY))), 8)
        self.assertEqual(len(generate(self.stub, metadata=token("old-key-being-rotated-out"))), 8)

    def test_grpc_health_and_metrics_need_no_token(self):
        self.assertEqual(health(self.channel), b"\x08\x01")
        with urllib.request.urlopen(self.server.metrics_url, timeout=10) as r:
            self.assertIn(b"pruneserve_num_requests_running", r.read())

    def test_plaintext_grpc_to_the_tls_port_is_refused(self):
        with grpc.insecure_channel(self.server.grpc_addr) as ch:
            with self.assertRaises(grpc.RpcError) as e:
                pb_grpc.GenerationStub(ch).GetModelInfo(pb.GetModelInfoRequest(), timeout=10, metadata=token(KEY))
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)

    def test_a_client_that_does_not_trust_the_server_refuses_it(self):
        with grpc.secure_channel(self.server.grpc_addr, grpc.ssl_channel_credentials()) as ch:  # system roots
            with self.assertRaises(grpc.RpcError) as e:
                health(ch)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)

    def openai_client(self, key):
        return openai.OpenAI(base_url=self.server.http_url + "/v1", api_key=key, max_retries=0, timeout=60,
                             http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=PKI["ca.crt"])))

    def test_openai_token(self):
        for key in ("wrong-key", KEY + "x"):
            with self.assertRaises(openai.AuthenticationError) as e:
                self.openai_client(key).completions.create(model="stories260K", prompt="Once", max_tokens=4)
            self.assertEqual(e.exception.status_code, 401)
            self.assertEqual(e.exception.body["type"], "authentication_error")
        out = self.openai_client(KEY).completions.create(model="stories260K", prompt="Once upon a time",
                                                         max_tokens=8, temperature=0,
                                                         extra_body={"ignore_eos": True})
        self.assertEqual(out.usage.completion_tokens, 8)
        streamed = self.openai_client(KEY).completions.create(model="stories260K", prompt="Once upon a time",
                                                              max_tokens=8, temperature=0, stream=True,
                                                              extra_body={"ignore_eos": True})
        self.assertEqual("".join(c.choices[0].text for c in streamed if c.choices), out.choices[0].text)

    def test_http_without_a_token_is_401_but_health_is_open(self):
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(self.server.http_url + "/v1/models", timeout=10, context=self.ctx)
        self.assertEqual(e.exception.code, 401)
        self.assertEqual(e.exception.headers["WWW-Authenticate"], "Bearer")
        self.assertEqual(json.loads(e.exception.read())["error"]["type"], "authentication_error")
        for path in ("/health", "/metrics"):
            with urllib.request.urlopen(self.server.http_url + path, timeout=10, context=self.ctx) as r:
                self.assertEqual(r.status, 200)

    def test_cli_and_loadtest_with_tls_and_a_key(self):
        def cli(*extra):
            return subprocess.run([ARGS.cli, "--addr", self.server.grpc_addr, "generate", "--prompt", "Once upon a time",
                                   "--max-new-tokens", "4", "--temperature", "0", "--ids", *extra],
                                  capture_output=True, text=True, timeout=60,
                                  env={k: v for k, v in os.environ.items() if k != "PRUNESERVE_API_KEY"})
        served = cli("--tls-ca", PKI["ca.crt"], "--api-key-file", PKI["keys"])  # its first key line
        self.assertEqual(served.returncode, 0, served.stderr)
        self.assertEqual(len(served.stdout.split()), 4)
        no_key = cli("--tls-ca", PKI["ca.crt"])
        self.assertEqual(no_key.returncode, 16, no_key.stderr)  # UNAUTHENTICATED
        self.assertNotEqual(cli("--api-key-file", PKI["keys"]).returncode, 0)  # plaintext to the TLS port
        out = os.path.join(PKI["dir"], "load.json")
        load = subprocess.run([ARGS.loadtest, "--addr", self.server.grpc_addr, "--tls-ca", PKI["ca.crt"],
                               "--api-key-file", PKI["keys"], "--dataset", PKI["prompts"], "--num-requests", "4",
                               "--progress", "off", "--result-file", out], capture_output=True, text=True, timeout=120)
        self.assertEqual(load.returncode, 0, load.stdout + load.stderr)
        with open(out) as f:
            self.assertEqual(json.load(f)["runs"][0]["completed"], 4)

    def test_plaintext_http_to_the_https_port_is_refused(self):
        with self.assertRaises((OSError, http.client.HTTPException)):
            urllib.request.urlopen(self.server.http_url.replace("https:", "http:") + "/health", timeout=10)


class MutualTlsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ctx = ssl.create_default_context(cafile=PKI["ca.crt"])
        cls.ctx.load_cert_chain(PKI["client.crt"], PKI["client.key"])
        cls.server = Server(ARGS.server, ARGS.model, "--threads", "1", "--tls-cert", PKI["server.crt"],
                            "--tls-key", PKI["server.key"], "--tls-client-ca", PKI["ca.crt"], http=True,
                            ssl_context=cls.ctx)
        cls.addClassCleanup(cls.server.close)  # kills it if setUpClass fails past here
        cls.server.wait_serving_http()

    @classmethod
    def tearDownClass(cls):
        code, log = cls.server.stop()
        assert code == 0, f"server exited with {code}:\n{log}"

    def test_grpc_needs_a_client_certificate_the_ca_signed(self):
        with grpc_channel(self.server.grpc_addr, "client") as ch:
            stub = pb_grpc.GenerationStub(ch)
            wait_loaded(stub)
            self.assertEqual(len(generate(stub)), 8)
        for cert in (None, "rogue"):
            with grpc_channel(self.server.grpc_addr, cert) as ch:
                with self.assertRaises(grpc.RpcError) as e:
                    health(ch)
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE, cert)

    def test_https_needs_a_client_certificate_the_ca_signed(self):
        with urllib.request.urlopen(self.server.http_url + "/v1/models", timeout=10, context=self.ctx) as r:
            self.assertEqual(r.status, 200)
        for cert in (None, "rogue"):
            ctx = ssl.create_default_context(cafile=PKI["ca.crt"])
            if cert:
                ctx.load_cert_chain(PKI[cert + ".crt"], PKI[cert + ".key"])
            with self.assertRaises((OSError, http.client.HTTPException), msg=cert):
                urllib.request.urlopen(self.server.http_url + "/v1/models", timeout=10, context=ctx).read()


class LimitsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(ARGS.server, ARGS.model, "--threads", "1", "--max-prompt-tokens", "32",
                            "--max-new-tokens", "300", "--max-stop-strings", "2", "--max-stop-string-bytes", "8",
                            "--max-request-bytes", "2048", "--max-streams-per-client", "1",
                            # Room for a reading client's 300 tokens while a write waits for the CPU (a
                            # test beside this one can hold it), none for a client that does not read.
                            "--max-stream-backlog", "200", http=True)
        cls.addClassCleanup(cls.server.close)  # kills it if setUpClass fails past here
        cls.channel = grpc.insecure_channel(cls.server.grpc_addr)
        cls.stub = pb_grpc.GenerationStub(cls.channel)
        wait_loaded(cls.stub)
        cls.server.wait_serving_http()
        cls.client = openai.OpenAI(base_url=cls.server.http_url + "/v1", api_key="unused", max_retries=0,
                                   timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        code, log = cls.server.stop()
        assert code == 0, f"server exited with {code}:\n{log}"

    def assert_exhausted(self, call, message):
        with self.assertRaises(grpc.RpcError) as e:
            call()
        self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn(message, e.exception.details())

    def assert_400(self, param, **kw):
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model="stories260K", **kw)
        self.assertEqual(e.exception.body["param"], param)

    def test_fields_beyond_the_limits(self):
        long_prompt = " ".join(["Once upon a time"] * 12)
        self.assert_exhausted(lambda: generate(self.stub, text=long_prompt), "this server takes 32 at most")
        self.assert_exhausted(lambda: generate(self.stub, n=301), "exceeds this server's limit 300")
        self.assert_exhausted(lambda: generate(self.stub, stop=["a", "b", "c"]), "3 stop strings")
        self.assert_exhausted(lambda: generate(self.stub, stop=["123456789"]), "stop string of 9 bytes")
        self.assertEqual(len(generate(self.stub, n=300)), 300)  # at the limits: served
        self.assert_400("prompt", prompt=long_prompt, max_tokens=4)
        self.assert_400("max_tokens", prompt="Once", max_tokens=301)
        self.assert_400("stop", prompt="Once", max_tokens=4, stop=["a", "b", "c"])

    def test_request_size(self):
        self.assert_exhausted(lambda: generate(self.stub, text="x" * 4096), "")
        req = urllib.request.Request(self.server.http_url + "/v1/completions", method="POST",
                                     data=json.dumps({"model": "stories260K", "prompt": "x" * 4096}).encode(),
                                     headers={"Content-Type": "application/json"})
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        self.assertEqual(e.exception.code, 413)

    def test_streams_per_client_and_a_client_that_does_not_read(self):
        # A small HTTP/2 window: the server's writes stall once the client stops reading.
        slow_channel = grpc.insecure_channel(self.server.grpc_addr, options=[("grpc.http2.lookahead_bytes", 1024),
                                                                            ("grpc.http2.bdp_probe", 0)])
        req = pb.GenerateRequest(text="Once upon a time", logprobs=True, top_logprobs=20,
                                 stopping=pb.StoppingCriteria(max_new_tokens=300, ignore_eos=True))
        finished_before = self.server.metric("pruneserve_requests_total")
        slow = pb_grpc.GenerationStub(slow_channel).Generate(req, timeout=60)
        self.assertTrue(next(slow).HasField("prompt_info"))  # admitted: the client's one stream is open
        self.assert_exhausted(lambda: generate(self.stub), "client 127.0.0.1 has 1 streams open")
        with self.assertRaises(openai.RateLimitError):
            self.client.completions.create(model="stories260K", prompt="Once", max_tokens=4)
        # The engine is done with the request (it was cancelled when the backlog filled) before the client reads.
        self.assertTrue(wait_for(lambda: self.server.metric("pruneserve_requests_total") > finished_before, 60))
        received = []
        with self.assertRaises(grpc.RpcError) as e:
            for msg in slow:
                received += msg.chunk.token_ids
        self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("did not read its stream", e.exception.details())
        self.assertLess(len(received), 300)  # cut short: what was sent before the backlog filled
        slow_channel.close()

        def served_again():  # once the server has closed the stream (just after its status was sent)
            try:
                return len(generate(self.stub)) == 8
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                return False
        self.assertTrue(wait_for(served_again, 10, step=0.05))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--loadtest", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--proto-dir", required=True)
    ARGS, rest = ap.parse_known_args()
    with tempfile.TemporaryDirectory() as pki_dir:
        PKI = make_pki(pki_dir)
        run_tests(ARGS.proto_dir, [sys.argv[0]] + rest, globals())
