#!/usr/bin/env python3
"""deploy/ validated offline: the Prometheus config and alert rules with promtool
(check config, check rules, and the rules' unit tests), the Kubernetes overlays
rendered by kustomize (`kubectl kustomize`) and validated with kubernetes-validate
(built-in kinds, strict) and, for the custom resources (InferencePool, HTTPRoute,
Gateway, PodMonitor), against the required fields of their upstream CRD schemas;
then the pieces checked against each other (ports, selectors, probes), and the
Grafana dashboard's shape."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import unittest

import jsonschema
import kubernetes_validate
import yaml

ARGS = None

PORT = {"type": "object", "required": ["number"],
        "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}}}
# The parts of the upstream CRDs' openAPIV3Schema that these manifests use, with
# their required fields (Gateway API v1, Inference Extension v1, Prometheus Operator v1).
CRD_SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): {
        "type": "object", "required": ["spec"],
        "properties": {"spec": {
            "type": "object", "required": ["selector", "targetPorts", "endpointPickerRef"],
            "properties": {
                "selector": {"type": "object", "required": ["matchLabels"],
                             "properties": {"matchLabels": {"type": "object", "minProperties": 1,
                                                            "additionalProperties": {"type": "string"}}}},
                "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8, "items": PORT},
                "endpointPickerRef": {
                    "type": "object", "required": ["name"],
                    "properties": {"name": {"type": "string", "minLength": 1}, "port": PORT,
                                   "failureMode": {"enum": ["FailOpen", "FailClose"]}}}},
            "additionalProperties": False}}},
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): {
        "type": "object", "required": ["spec"],
        "properties": {"spec": {"type": "object", "properties": {
            "parentRefs": {"type": "array", "items": {"type": "object", "required": ["name"]}},
            "rules": {"type": "array", "items": {"type": "object", "properties": {
                "backendRefs": {"type": "array", "items": {"type": "object", "required": ["name"]}}}}}}}}},
    ("gateway.networking.k8s.io/v1", "Gateway"): {
        "type": "object", "required": ["spec"],
        "properties": {"spec": {"type": "object", "required": ["gatewayClassName", "listeners"], "properties": {
            "listeners": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["name", "port", "protocol"]}}}}}},
    ("monitoring.coreos.com/v1", "PodMonitor"): {
        "type": "object", "required": ["spec"],
        "properties": {"spec": {"type": "object", "required": ["selector", "podMetricsEndpoints"], "properties": {
            "podMetricsEndpoints": {"type": "array", "minItems": 1,
                                    "items": {"type": "object", "required": ["port"]}}}}}},
}


def run(*cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{p.stdout}{p.stderr}")
    return p.stdout


class ManifestsTest(unittest.TestCase):
    def path(self, *parts):
        return os.path.join(ARGS.deploy, *parts)

    def render(self, overlay):
        return [d for d in yaml.safe_load_all(run(ARGS.kubectl, "kustomize", self.path("kubernetes", overlay))) if d]

    def validate(self, docs):
        for d in docs:
            key = (d["apiVersion"], d["kind"])
            if key in CRD_SCHEMAS:
                jsonschema.validate(d, CRD_SCHEMAS[key])
            else:
                kubernetes_validate.validate(d, ARGS.kubernetes_version, strict=True)

    def test_prometheus_config_and_rules(self):
        run("promtool", "check", "config", self.path("prometheus", "prometheus.yml"))
        out = run("promtool", "check", "rules", self.path("prometheus", "alerts.yml"))
        self.assertIn("SUCCESS: 6 rules found", out)
        p = subprocess.run(["promtool", "test", "rules", "alerts_test.yml"], cwd=self.path("prometheus"),
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def test_overlays_render_and_validate(self):
        kinds = {}
        for overlay in ("overlays/cpu", "overlays/gpu", "gateway"):
            docs = self.render(overlay)
            self.validate(docs)
            kinds[overlay] = sorted(d["kind"] for d in docs)
            for d in docs:
                if d["kind"] != "Namespace":
                    self.assertEqual(d["metadata"].get("namespace"), "pruneserve", d["metadata"]["name"])
        for overlay in ("overlays/cpu", "overlays/gpu"):
            self.assertEqual(kinds[overlay], ["Deployment", "HorizontalPodAutoscaler", "Namespace",
                                              "PodDisruptionBudget", "PodMonitor", "Service", "Service"])
        self.assertEqual(kinds["gateway"], ["ConfigMap", "Deployment", "Gateway", "HTTPRoute", "InferencePool",
                                            "Role", "RoleBinding", "Service", "ServiceAccount"])

    def test_a_broken_manifest_fails_validation(self):
        docs = self.render("overlays/cpu")
        dep = next(d for d in docs if d["kind"] == "Deployment")
        dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "not a number"
        with self.assertRaises(kubernetes_validate.ValidationError):
            self.validate([dep])
        pool = next(d for d in self.render("gateway") if d["kind"] == "InferencePool")
        del pool["spec"]["targetPorts"]
        with self.assertRaises(jsonschema.ValidationError):
            self.validate([pool])

    def test_the_pieces_agree(self):
        for overlay, device in (("overlays/cpu", "cpu"), ("overlays/gpu", "cuda")):
            docs = self.render(overlay)
            dep = next(d for d in docs if d["kind"] == "Deployment")
            pod = dep["spec"]["template"]
            c = pod["spec"]["containers"][0]
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            self.assertEqual(ports, {"grpc": 50051, "http": 8000, "metrics": 9090})
            self.assertIn(f"--device={device}", c["args"])
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                self.assertEqual(c[probe]["grpc"]["port"], ports["grpc"], probe)
            labels = pod["metadata"]["labels"]
            for d in docs:
                sel = d.get("spec", {}).get("selector")
                if d["kind"] in ("Deployment", "PodDisruptionBudget", "PodMonitor"):
                    sel = sel["matchLabels"]
                if d["kind"] in ("Service", "Deployment", "PodDisruptionBudget", "PodMonitor"):
                    self.assertTrue(set(sel.items()) <= set(labels.items()), f"{d['kind']} selector {sel}")
            hpa = next(d for d in docs if d["kind"] == "HorizontalPodAutoscaler")
            self.assertEqual(hpa["spec"]["scaleTargetRef"]["name"], dep["metadata"]["name"])
            self.assertGreaterEqual(dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], 30)
        pool = next(d for d in self.render("gateway") if d["kind"] == "InferencePool")
        self.assertEqual(pool["spec"]["targetPorts"][0]["number"], ports["http"])
        self.assertTrue(set(pool["spec"]["selector"]["matchLabels"].items()) <= set(labels.items()))
        gateway = self.render("gateway")
        epp_service = next(d for d in gateway if d["kind"] == "Service")
        self.assertEqual(epp_service["metadata"]["name"], pool["spec"]["endpointPickerRef"]["name"])
        self.assertIn(pool["spec"]["endpointPickerRef"]["port"]["number"],
                      [p["port"] for p in epp_service["spec"]["ports"]])
        # The EPP reads its plugins from the ConfigMap it mounts: prefix-cache scoring in the default profile.
        epp = next(d for d in gateway if d["kind"] == "Deployment")["spec"]["template"]["spec"]
        config_map = next(d for d in gateway if d["kind"] == "ConfigMap")
        self.assertEqual(epp["volumes"][0]["configMap"]["name"], config_map["metadata"]["name"])
        mount = epp["containers"][0]["volumeMounts"][0]
        self.assertEqual(mount["name"], epp["volumes"][0]["name"])
        (name, text), = config_map["data"].items()
        self.assertIn(f"--config-file={mount['mountPath']}/{name}", epp["containers"][0]["args"])
        config = yaml.safe_load(text)
        self.assertEqual(config["kind"], "EndpointPickerConfig")
        declared = {p["type"] for p in config["plugins"]}
        profile = [p["pluginRef"] for p in config["schedulingProfiles"][0]["plugins"]]
        self.assertIn("prefix-cache-scorer", profile)
        self.assertTrue(set(profile) <= declared, profile)
        route = next(d for d in gateway if d["kind"] == "HTTPRoute")
        self.assertEqual(route["spec"]["rules"][0]["backendRefs"][0]["name"], pool["metadata"]["name"])
        with open(self.path("kubernetes", "prometheus-adapter", "values.yaml")) as f:
            adapter = yaml.safe_load(f)
        hpa_metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
        self.assertEqual(adapter["rules"]["custom"][0]["name"]["as"], hpa_metric)

    def test_dashboard_shape(self):
        with open(self.path("grafana", "pruneserve-dashboard.json")) as f:
            dash = json.load(f)
        titles = [p["title"] for p in dash["panels"]]
        self.assertEqual(len(titles), len(set(titles)))
        self.assertEqual(len({p["id"] for p in dash["panels"]}), len(titles))
        for want in ("Time to first token", "Inter-token latency", "End-to-end latency", "Token throughput",
                     "Prefix cache hit rate by tier",
                     "KV cache usage by tier", "KV swap traffic", "Preemptions", "Pruned prompt tokens by strategy"):
            self.assertIn(want, titles)
        for p in dash["panels"]:
            self.assertTrue(p["targets"], p["title"])


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--deploy", required=True)
    ap.add_argument("--kubectl", default=shutil.which("kubectl") or "kubectl")
    ap.add_argument("--kubernetes-version", default="1.30.0")
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
