"""Validates manifests rendered by `helm template` (run by scripts/chart-check
with the Python of .tools/venv).

Every document must pass one schema, or the run fails:

* Kubernetes kinds: kubernetes-validate's bundled schemas for the Kubernetes
  version given with --kube, in strict mode (unknown fields are errors). It
  is called as a library, not through its command line, because the command
  line only prints a WARN and exits 0 for a kind it has no schema for; here
  a missing schema is a failure.
* ServiceMonitor (monitoring.coreos.com/v1), which kubernetes-validate does
  not bundle: the JSON schema in scripts/chart-schemas/, checked with the
  jsonschema package kubernetes-validate depends on.

Then a few rules of the chart that no schema states (--policy): the
lockstep container's hardening and probes, a grace period longer than
lockstep's preStop pause plus its drain timeout, a Service that never
exposes the backend's port, and a Grafana dashboard in a ConfigMap that
still parses as a dashboard once rendered (tests/dashboard.rs checks the
file itself, and its metric names against the binary).

usage: chart_validate.py --kube 1.33.0 [--policy] FILE...
"""

import argparse
import json
import math
import sys
import tomllib
from pathlib import Path

import jsonschema
import yaml
from kubernetes_validate import utils as kv

SCHEMAS = Path(__file__).resolve().parent / "chart-schemas"
EXTRA_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SCHEMAS / "servicemonitor-monitoring-v1.json",
}


def validate_document(doc, kube):
    """Returns (schema used, error or None)."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in EXTRA_SCHEMAS:
        path = EXTRA_SCHEMAS[key]
        schema = json.loads(path.read_text())
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=str)
        if errors:
            e = errors[0]
            where = ".".join(str(p) for p in e.absolute_path)
            return path.name, f"{where}: {e.message}"
        return path.name, None
    try:
        version = kv.validate(doc, kube, strict=True)
        return f"kubernetes {version} strict", None
    except kv.ValidationError as e:
        where = ".".join(str(p) for p in e.path)
        return f"kubernetes {e.version} strict", f"{where}: {e.message}"
    except kv.SchemaNotFoundError as e:
        return "none", f"no schema: {e.message}"
    except kv.VersionNotSupportedError:
        return "none", f"kubernetes-validate {kv.__version__} has no schemas for {kube}"


def pod_spec(doc):
    if doc.get("kind") in ("Deployment", "StatefulSet", "DaemonSet"):
        return doc["spec"]["template"]["spec"]
    return None


def policy(docs):
    """The chart's own rules; returns a list of violations."""
    problems = []
    tomls = {}
    for doc in docs:
        if doc.get("kind") == "ConfigMap" and "lockstep.toml" in doc.get("data", {}):
            tomls[doc["metadata"]["name"]] = tomllib.loads(doc["data"]["lockstep.toml"])
    backend_ports = set()
    for doc in docs:
        spec = pod_spec(doc)
        if spec is None:
            continue
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        lockstep = [c for c in spec["containers"] if c["name"] == "lockstep"]
        if len(lockstep) != 1:
            problems.append(f"{name}: no lockstep container")
            continue
        c = lockstep[0]
        for other in spec["containers"]:
            if other is not c:
                backend_ports.update(p["containerPort"] for p in other.get("ports", []))
        sc = c.get("securityContext", {})
        wanted = {
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
        }
        for k, v in wanted.items():
            if sc.get(k) is not v:
                problems.append(f"{name}: lockstep securityContext.{k} is not {v}")
        if sc.get("capabilities", {}).get("drop") != ["ALL"]:
            problems.append(f"{name}: lockstep does not drop ALL capabilities")
        if sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{name}: lockstep seccompProfile is not RuntimeDefault")
        # With client certificates on the admin listener the kubelet (which
        # has none) can only check that the admin port accepts connections.
        mtls = any(m.get("name") == "lockstep-admin-client-ca" for m in c.get("volumeMounts", []))
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            if mtls:
                if c.get(probe, {}).get("tcpSocket", {}).get("port") != "admin":
                    problems.append(f"{name}: lockstep {probe} is not a TCP check of the admin port (mTLS)")
                continue
            get = c.get(probe, {}).get("httpGet", {})
            if get.get("path") != path or get.get("port") != "admin":
                problems.append(f"{name}: lockstep {probe} is not GET {path} on the admin port")
        if not c.get("resources", {}).get("requests") or not c.get("resources", {}).get("limits"):
            problems.append(f"{name}: lockstep has no resource requests and limits")
        config_volume = next(
            (v for v in spec.get("volumes", []) if v["name"] == "lockstep-config"), None
        )
        toml = tomls.get((config_volume or {}).get("configMap", {}).get("name"))
        if toml is None:
            problems.append(f"{name}: the lockstep-config volume names no rendered ConfigMap")
            continue
        drain = math.ceil(toml.get("server", {}).get("drain_timeout_ms", 25000) / 1000)
        pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        grace = spec.get("terminationGracePeriodSeconds", 30)
        if grace <= drain + pre_stop:
            problems.append(
                f"{name}: terminationGracePeriodSeconds {grace} <= preStop {pre_stop} + drain {drain}"
            )
        annotations = doc["spec"]["template"]["metadata"].get("annotations", {})
        if not any(k.startswith("checksum/") for k in annotations):
            problems.append(f"{name}: no checksum/ annotation to roll the Pods on a config change")
    for doc in docs:
        if doc.get("kind") != "ConfigMap":
            continue
        for key, text in doc.get("data", {}).items():
            if not key.endswith(".json"):
                continue
            where = f"ConfigMap/{doc['metadata']['name']} {key}"
            try:
                dashboard = json.loads(text)
            except json.JSONDecodeError as e:
                problems.append(f"{where}: not JSON: {e}")
                continue
            if not dashboard.get("uid") or not dashboard.get("panels"):
                problems.append(f"{where}: not a Grafana dashboard (no uid or no panels)")
    for doc in docs:
        if doc.get("kind") != "Service":
            continue
        for p in doc["spec"].get("ports", []):
            if p.get("targetPort") in backend_ports or p.get("targetPort") == "backend":
                problems.append(f"Service/{doc['metadata']['name']}: exposes the backend's port")
    return problems


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kube", required=True, help="Kubernetes version, e.g. 1.33.0")
    parser.add_argument("--policy", action="store_true", help="also check the chart's rules")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    failed = 0
    for name in args.files:
        with open(name) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        if not docs:
            print(f"FAIL {name}: no manifests")
            failed += 1
            continue
        for doc in docs:
            what = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            schema, error = validate_document(doc, args.kube)
            if error:
                print(f"FAIL {name}: {what} ({schema}): {error}")
                failed += 1
            else:
                print(f"ok   {name}: {what} ({schema})")
        if args.policy:
            for problem in policy(docs):
                print(f"FAIL {name}: {problem}")
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
