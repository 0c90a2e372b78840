#!/usr/bin/env python3
"""A real Prometheus (Debian's package) scrapes a loaded pruneserve on loopback
with deploy/prometheus/alerts.yml loaded; then every PromQL expression of the
Grafana dashboard and of the alert rules is evaluated through its HTTP API: each
must evaluate without error and return data (an alert's expression without its
threshold: the alert itself only returns data when it fires), and every rule
group must evaluate healthily."""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import unittest
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from serverproc import Server, wait_for  # noqa: E402

ARGS = None
# Grafana's variables, as the dashboard's defaults resolve them.
GRAFANA_VARS = {"$__rate_interval": "1m", "$instance": ".*"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alert_rules(path):
    """(name, expression, expression without its final `> N` / `== N`) of each alert."""
    import yaml  # Debian's python3-yaml
    with open(path) as f:
        doc = yaml.safe_load(f)
    out = []
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            expr = rule["expr"].strip()
            m = re.fullmatch(r"(.*\S)\s*(>|<|==|>=|<=|!=)\s*[0-9.]+", expr, re.S)
            assert m, f"{rule['alert']}: not `EXPRESSION OP NUMBER`: {expr}"
            out.append((rule["alert"], expr, m.group(1)))
    return out


def dashboard_exprs(path):
    with open(path) as f:
        dash = json.load(f)
    exprs = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            e = target["expr"]
            for var, value in GRAFANA_VARS.items():
                e = e.replace(var, value)
            assert "$" not in e, f"unresolved variable in {e}"
            exprs.append((panel["title"], e))
    return exprs


class PrometheusTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.server = Server(ARGS.server, ARGS.model, "--threads", "2")
        cls.addClassCleanup(cls.server.close)  # kills it if setUpClass fails past here
        metrics_target = cls.server.metrics_url.split("//")[1].split("/")[0]
        config = os.path.join(cls.tmp.name, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {os.path.abspath(os.path.join(ARGS.deploy, "prometheus", "alerts.yml"))}
scrape_configs:
  - job_name: pruneserve
    static_configs:
      - targets: ["{metrics_target}"]
""")
        cls.prom_url = f"http://127.0.0.1:{free_port()}"
        cls.prom_log = open(os.path.join(cls.tmp.name, "prometheus.log"), "w+")
        cls.prom = subprocess.Popen([ARGS.prometheus, f"--config.file={config}",
                                     f"--storage.tsdb.path={os.path.join(cls.tmp.name, 'data')}",
                                     f"--web.listen-address={cls.prom_url.split('//')[1]}"],
                                    stdout=cls.prom_log, stderr=subprocess.STDOUT)
        up = wait_for(lambda: cls.query_or_none('up{job="pruneserve"} == 1'), 60, step=0.2)
        assert up, f"Prometheus never scraped the server:\n{cls.log(cls.prom_log)}"

    @classmethod
    def tearDownClass(cls):
        cls.prom.terminate()
        cls.prom.wait(timeout=30)
        cls.prom_log.close()
        code, log = cls.server.stop()
        cls.tmp.cleanup()
        assert code == 0, f"server exited with {code}:\n{log}"

    @staticmethod
    def log(f):
        f.seek(0)
        return f.read()[-4000:]

    @classmethod
    def api(cls, path, **params):
        url = f"{cls.prom_url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)

    @classmethod
    def query_or_none(cls, expr):
        try:
            r = cls.api("query", query=expr)
        except OSError:
            return None
        return r["data"]["result"] if r["status"] == "success" and r["data"]["result"] else None

    def test_every_dashboard_and_alert_expression_returns_data(self):
        p = subprocess.run([ARGS.loadtest, "--addr", self.server.grpc_addr, "--haystack", ARGS.haystack,
                            "--num-requests", "0", "--duration", "4", "--request-rate", "30", "--input-len", "48",
                            "--output-len", "12", "--cancel-fraction", "0.1", "--cancel-within", "0.02",
                            "--strategy-mix", "full=2,lazyllm=1,gemfilter=1,critiprefill=1", "--progress", "off"],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        # Wait until Prometheus holds a scrape taken after the last request ended.
        total = self.server.metric("pruneserve_requests_total")
        self.assertGreater(total, 0)
        self.assertTrue(wait_for(lambda: (r := self.query_or_none("sum(pruneserve_requests_total)"))
                                 and float(r[0]["value"][1]) == total, 30, step=0.2))
        checked = 0
        for title, expr in dashboard_exprs(os.path.join(ARGS.deploy, "grafana", "pruneserve-dashboard.json")):
            r = self.api("query", query=expr)
            self.assertEqual(r["status"], "success", f"{title}: {expr}: {r}")
            self.assertTrue(r["data"]["result"], f"dashboard panel '{title}': no data for {expr}")
            checked += 1
        for name, expr, lhs in alert_rules(os.path.join(ARGS.deploy, "prometheus", "alerts.yml")):
            self.assertEqual(self.api("query", query=expr)["status"], "success", name)
            r = self.api("query", query=lhs)
            self.assertEqual(r["status"], "success", f"{name}: {lhs}")
            self.assertTrue(r["data"]["result"], f"alert {name}: no data for {lhs}")
            checked += 1
        self.assertGreaterEqual(checked, 30)
        groups = self.api("rules")["data"]["groups"]
        self.assertEqual([g["name"] for g in groups], ["pruneserve"])
        for rule in groups[0]["rules"]:
            self.assertEqual(rule["health"], "ok", rule)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--loadtest", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--haystack", required=True)
    ap.add_argument("--deploy", required=True)
    ap.add_argument("--prometheus", default="/usr/bin/prometheus")
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
