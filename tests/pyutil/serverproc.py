"""A pruneserve process on loopback for the Python integration tests: free ports
(--port-file), waits for the model to load, scrapes /metrics, and stops with
SIGTERM, asserting a clean exit. close() (a test's cleanup) kills one a failed assertion left
running. Polls with deadlines; never sleeps to synchronise."""
import os
import signal
import subprocess
import tempfile
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def wait_for(cond, timeout, step=0.01):
    """Polls cond() until it is true or `timeout` seconds pass; returns its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(step)
    return cond()


def kill_if_running(proc):
    """SIGKILL for a child process that still runs, and its exit collected."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


class Server:
    def __init__(self, binary, model, *args, http=False, ssl_context=None):
        """ssl_context: the HTTP front serves HTTPS (the server was given --tls-cert); used to reach /health."""
        self.ssl_context = ssl_context
        self.tmp = tempfile.TemporaryDirectory()
        port_file = os.path.join(self.tmp.name, "ports")
        self.log = open(os.path.join(self.tmp.name, "server.log"), "w+")
        cmd = [binary, "--model", model, "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
               "--port-file", port_file, *args]
        if http:
            cmd += ["--http-port", "0"]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        if not wait_for(lambda: os.path.exists(port_file) or self.proc.poll() is not None, 30) or \
                not os.path.exists(port_file):
            log = self.read_log()
            self.close()
            raise RuntimeError(f"the server wrote no port file:\n{log}")
        with open(port_file) as f:
            ports = dict(line.strip().split("=") for line in f)
        self.grpc_addr = f"127.0.0.1:{ports['grpc']}"
        self.metrics_url = f"http://127.0.0.1:{ports['metrics']}/metrics"
        scheme = "https" if ssl_context else "http"
        self.http_url = f"{scheme}://127.0.0.1:{ports['http']}" if http else None

    def read_log(self):
        self.log.seek(0)
        return self.log.read()

    def wait_serving_http(self, timeout=120):
        def ok():
            try:
                return urllib.request.urlopen(self.http_url + "/health", timeout=1,
                                              context=self.ssl_context).status == 200
            except OSError:
                return False
        if not wait_for(ok, timeout, step=0.05):
            raise RuntimeError(f"the HTTP front is not serving:\n{self.read_log()}")

    def metrics(self):
        """{(name, frozenset(labels)): value} of the /metrics page."""
        page = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        return {(s.name, frozenset(s.labels.items())): s.value
                for fam in text_string_to_metric_families(page) for s in fam.samples}

    def metric(self, name, **labels):
        """The sum of the samples named `name` whose labels include `labels`."""
        return sum(v for (n, ls), v in self.metrics().items()
                   if n == name and all((k, val) in ls for k, val in labels.items()))

    def request_blocks(self, tier):
        """KV blocks of `tier` in use and not the prefix cache's: what requests hold (0 once idle)."""
        return (self.metric("pruneserve_kv_blocks", tier=tier, state="used")
                - self.metric("pruneserve_prefix_cache_blocks", tier=tier))

    def stop(self):
        """SIGTERM; returns (exit code, log)."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        log = self.read_log()
        self.close()
        return code, log

    def close(self):
        """Kills the process if it still runs and removes its files; safe to call again."""
        kill_if_running(self.proc)
        self.log.close()
        self.tmp.cleanup()
