#!/usr/bin/env python3
"""Lints and renders Kinference's Helm charts with real Helm, and validates what they render.

    python3 kinfctl/tests/helm/render.py --out DIR

For every case below (a chart, a namespace and `--set` overrides, parsed by Helm's own `--set`
parser), this script:

  1. lints the chart with Helm (strict: warnings fail) and checks the values against the chart's
     values.schema.json;
  2. renders it offline with Helm's Go SDK (the PyPI package `helm-python-sdk`);
  3. validates every rendered object: built-in kinds with `kubernetes-validate` (strict: unknown
     fields fail) against the oldest Kubernetes the charts support and the newest it knows;
     objects of our CRDs with `jsonschema` against the CRD's openAPIV3Schema, as the API server
     would (unknown fields fail, as with kubectl's default strict field validation);
  4. writes DIR/<case>.yaml (the rendered documents) and DIR/cases.json (each case, its file, and
     the `kinfctl install` arguments that must print the same objects).

It also validates the manifests under examples/ the same way, and checks that the validators do
reject broken objects, so that a validator that accepts everything cannot pass.

Exit codes: 0 all good; 1 a check failed; 3 the Python packages are missing
(`pip install helm-python-sdk kubernetes-validate jsonschema`).
"""

import argparse
import copy
import json
import pathlib
import sys

try:
    import helm_python as helm
    import jsonschema
    import kubernetes_validate
    import yaml
except ImportError as e:  # The Rust test turns this into a skip, or a failure under CI.
    print(f"missing Python package: {e.name} "
          "(pip install helm-python-sdk kubernetes-validate jsonschema)", file=sys.stderr)
    sys.exit(3)

ROOT = pathlib.Path(__file__).resolve().parents[3]
CHARTS = ROOT / "charts"
MIN_KUBE = "1.30"  # The charts' kubeVersion floor.
RELEASE = "kinference"

# name, chart, namespace, --set overrides (Helm syntax), the kinfctl install flags of the chart.
CASES = [
    ("crds-default", "kinference-crds", "kinference", [], ["--crds"]),
    ("crds-upstream", "kinference-crds", "kinference", ["upstream.inferencePool=true"], ["--crds"]),
    ("control-plane-default", "kinference", "kinference", [], ["--namespace", "kinference"]),
    ("control-plane-overrides", "kinference", "kinf-system",
     ["controller.replicas=3,proxy.logLevel=debug",
      "proxy.image.tag=v9.9.9",
      "injector.excludeNamespaces={monitoring,ci}",
      "imagePullSecrets[0].name=regcred",
      "networkPolicy.apiServerCIDRs={172.18.0.0/16,fd00:18::/64}"],
     ["--namespace", "kinf-system"]),
    ("control-plane-no-network-policy", "kinference", "kinference",
     ["networkPolicy.enabled=false"], ["--namespace", "kinference"]),
    ("control-plane-signals", "kinference", "kinference",
     ["signals.enabled=true,signals.port=8093,signals.loadIntervalMs=20"], ["--namespace", "kinference"]),
    # Two signal shards (docs/signals.md, "Sharding"), one with its own replicas and resources;
    # then without NetworkPolicies.
    ("control-plane-signal-shards", "kinference", "kinf-system",
     ["signals.enabled=true,signals.port=8093,"
      "signals.shards[0].name=a,signals.shards[0].replicas=2,"
      "signals.shards[0].resources.requests.cpu=1500m,"
      "signals.shards[0].resources.requests.memory=256Mi,"
      "signals.shards[1].name=b",
      "imagePullSecrets[0].name=regcred"],
     ["--namespace", "kinf-system"]),
    ("control-plane-signal-shards-no-network-policy", "kinference", "kinference",
     ["signals.enabled=true,signals.shards[0].name=a,networkPolicy.enabled=false"],
     ["--namespace", "kinference"]),
    # One replica judges rollouts alone: no peers Service, env or NetworkPolicy rule.
    ("control-plane-one-replica", "kinference", "kinference",
     ["controller.replicas=1"], ["--namespace", "kinference"]),
    ("viz-default", "kinference-viz", "kinference", [], None),
]

failures = []
quiet = False


def fail(msg):
    failures.append(msg)
    if not quiet:
        print(f"FAIL: {msg}", file=sys.stderr)


def crd_validator(crd):
    """A jsonschema validator of one CRD's served version, strict as the API server is."""
    version = next(v for v in crd["spec"]["versions"] if v.get("served", True))
    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])

    def convert(node):
        if not isinstance(node, dict):
            return node
        for key in ("properties", "patternProperties", "definitions"):
            for child in node.get(key, {}).values():
                convert(child)
        for key in ("items", "additionalProperties", "not"):
            if isinstance(node.get(key), dict):
                convert(node[key])
        for key in ("allOf", "anyOf", "oneOf"):
            for child in node.get(key, []):
                convert(child)
        if node.pop("x-kubernetes-int-or-string", False):
            node.pop("type", None)
            node.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
        if node.pop("nullable", False) and "type" in node:
            node["type"] = [node["type"], "null"]
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
        return node

    convert(schema)
    schema.setdefault("properties", {}).update(
        {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
         "metadata": {"type": "object"}})
    return jsonschema.Draft7Validator(schema)


def validate(obj, where, crds):
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    key = (api_version, kind)
    if key in crds:
        errors = sorted(crds[key].iter_errors(obj), key=lambda e: list(e.path))
        for e in errors:
            fail(f"{where}: {kind} {obj['metadata'].get('name')}: "
                 f"{'/'.join(map(str, e.path))}: {e.message}")
        return not errors
    ok = True
    for version in (MIN_KUBE, kubernetes_validate.utils.latest_version()):
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            ok = False
            fail(f"{where}: {kind} {obj['metadata'].get('name')} (Kubernetes {version}): "
                 f"{'/'.join(map(str, e.path))}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            ok = False
            fail(f"{where}: {e.message}")
    return ok


def render(chart, namespace, sets):
    values = {}
    for s in sets:
        values = merge(values, helm.parse_set_string(s))
    path = CHARTS / chart
    report = helm.lint(path, values or None, strict=True, namespace=namespace,
                       kube_version=f"v{MIN_KUBE}.0")
    for m in report["messages"]:
        if m["severity"] >= 2:
            fail(f"helm lint {chart}: {m['path']}: {m['error']}")
    for e in report["errors"]:
        fail(f"helm lint {chart}: {e}")
    with helm.Chart.load(path) as c:
        c.validate_schema(values or None)
        rendered = c.render(values or None, name=RELEASE, namespace=namespace, is_install=True)
    docs = []
    for template in sorted(rendered):
        if template.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(rendered[template]) if d is not None)
    return values, docs


def merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=pathlib.Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"Helm SDK {helm.helm_sdk_version()}, kubernetes-validate schemas "
          f"{MIN_KUBE} and {kubernetes_validate.utils.latest_version()}", file=sys.stderr)

    # Our CRDs, as the CRD chart renders them with every option on.
    _, crd_docs = render("kinference-crds", RELEASE, ["upstream.inferencePool=true"])
    crds = {}
    for crd in crd_docs:
        for v in crd["spec"]["versions"]:
            api = f"{crd['spec']['group']}/{v['name']}"
            crds[(api, crd["spec"]["names"]["kind"])] = crd_validator(crd)
    for want in ("InferencePolicy", "InferenceClassifier", "InferencePool"):
        if not any(kind == want for _, kind in crds):
            fail(f"the CRD chart renders no {want} CRD")

    cases = []
    for name, chart, namespace, sets, kinfctl in CASES:
        values, docs = render(chart, namespace, sets)
        valid = sum(validate(d, f"{name}", crds) for d in docs)
        print(f"{name}: {chart} rendered {len(docs)} objects, {valid} valid", file=sys.stderr)
        out = args.out / f"{name}.yaml"
        out.write_text("".join("---\n" + yaml.safe_dump(d, sort_keys=True) for d in docs))
        if kinfctl is not None:
            kinfctl_args = ["install", *kinfctl]
            for s in sets:
                kinfctl_args += ["--set", s]
            cases.append({"name": name, "chart": chart, "namespace": namespace,
                          "values": values, "objects": len(docs), "file": str(out),
                          "kinfctl": kinfctl_args})

    # The example manifests: our kinds against the CRDs, built-in kinds against Kubernetes.
    examples = 0
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:
                continue
            if doc.get("apiVersion", "").startswith("gateway.networking.k8s.io/"):
                continue  # The Gateway API's CRDs are not ours to ship.
            validate(doc, f"examples/{path.name}", crds)
            examples += 1
    print(f"examples: {examples} objects validated", file=sys.stderr)

    # The validators must reject what the API server would reject.
    bad_policy = {"apiVersion": "policy.kinference.io/v1alpha1", "kind": "InferencePolicy",
                  "metadata": {"name": "bad"}, "spec": {"targetRef": {"nmae": "x"}}}
    bad_deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "bad"},
                      "spec": {"replicas": "two", "selector": {}, "template": {}}}
    global quiet
    for bad in (bad_policy, bad_deployment):
        before, quiet = len(failures), True
        accepted = validate(bad, "self-test", crds)
        reasons = failures[before:]
        del failures[before:]  # The expected rejections are not failures.
        quiet = False
        if accepted:
            fail(f"self-test: a broken {bad['kind']} was accepted")
        else:
            print(f"self-test: a broken {bad['kind']} is rejected ({len(reasons)} errors)",
                  file=sys.stderr)

    (args.out / "cases.json").write_text(json.dumps(cases, indent=2))
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
