"""compose.yaml, the Kubernetes base and the components agree on probes, ports, volumes and environment."""
from __future__ import annotations

import os
import re

import pytest
import yaml

from tests.deploy.deploy_helpers import K8S, REPO, by_kind, load

PORT = 8000


@pytest.fixture(scope="module")
def compose():
    with open(os.path.join(REPO, "compose.yaml")) as f:
        return yaml.safe_load(f)["services"]["turingbox"]


def base():
    objs = {}
    for f in ("configmap.yaml", "deployment.yaml", "service.yaml", "pvc.yaml"):
        objs.update(by_kind(load(os.path.join(K8S, f))))
    return objs


def component(name: str) -> dict[str, dict]:
    objs = {}
    folder = os.path.join(K8S, "components", name)
    for f in sorted(os.listdir(folder)):
        if f.endswith(".yaml") and f != "kustomization.yaml":
            objs.update(by_kind(load(os.path.join(folder, f))))
    return objs


def pod_containers():
    """(where, pod spec, serving container) for every pod that runs `turingbox serve`."""
    dep = base()["Deployment/turingbox"]["spec"]["template"]
    lws = component("multinode")["LeaderWorkerSet/turingbox"]["spec"]["leaderWorkerTemplate"]
    return [("deployment", dep, dep["spec"]["containers"][0]),
            ("lws leader", lws["leaderTemplate"], lws["leaderTemplate"]["spec"]["containers"][0])]


def test_one_port_everywhere(compose):
    assert compose["ports"][0].endswith(f":{PORT}")                         # host:container
    assert f"TURINGBOX_PORT={PORT}" in compose["environment"]
    svc = base()["Service/turingbox"]["spec"]["ports"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc] == [("http", PORT, "http")]
    for where, pod, c in pod_containers():
        assert {"name": "http", "containerPort": PORT} in c["ports"], where
        ann = pod["metadata"].get("annotations", {})
        assert ann.get("prometheus.io/port") == str(PORT) and ann.get("prometheus.io/path") == "/metrics", where
    sm = component("servicemonitor")["ServiceMonitor/turingbox"]["spec"]
    assert [e["port"] for e in sm["endpoints"]] == ["http"] and sm["endpoints"][0]["path"] == "/metrics"
    assert sm["selector"]["matchLabels"].items() <= base()["Service/turingbox"]["metadata"]["labels"].items()
    pool = component("inference-gateway")["InferencePool/turingbox"]["spec"]
    assert pool["targetPorts"] == [{"number": PORT}]                       # traffic and the picker's metrics scrape


def test_probes_agree(compose):
    health = " ".join(compose["healthcheck"]["test"])
    assert "/health/ready" in health and f":{PORT}/" in health               # compose "healthy" = Kubernetes ready
    (_, _, dep), (_, _, leader) = pod_containers()
    for probe, path in (("startupProbe", "/health/startup"), ("readinessProbe", "/health/ready"),
                        ("livenessProbe", "/health/live")):
        assert dep[probe]["httpGet"] == {"path": path, "port": "http"}, probe
        assert leader[probe] == dep[probe], f"the LWS leader's {probe} differs from the Deployment's"
    assert leader["lifecycle"] == dep["lifecycle"]


def test_stop_grace_covers_the_drain_everywhere(compose):
    config = base()["ConfigMap/turingbox"]["data"]
    needed = float(config["TURINGBOX_DRAIN_GRACE_SECONDS"]) + float(config["TURINGBOX_VLLM_STOP_GRACE_SECONDS"])
    compose_grace = float(re.fullmatch(r"(\d+)s", compose["stop_grace_period"]).group(1))
    assert compose_grace > needed
    lws = component("multinode")["LeaderWorkerSet/turingbox"]["spec"]["leaderWorkerTemplate"]
    for where, pod, c in pod_containers():
        pre_stop = float(c["lifecycle"]["preStop"]["exec"]["command"][-1])
        grace = pod["spec"]["terminationGracePeriodSeconds"]
        assert grace == compose_grace and grace > pre_stop + needed, where
    assert lws["workerTemplate"]["spec"]["terminationGracePeriodSeconds"] == \
        lws["leaderTemplate"]["spec"]["terminationGracePeriodSeconds"]
    epp = component("inference-gateway")["Deployment/turingbox-epp"]["spec"]["template"]["spec"]
    assert epp["terminationGracePeriodSeconds"] > pod_containers()[0][1]["spec"]["terminationGracePeriodSeconds"]


def test_volumes_agree(compose):
    compose_mounts = {v.split(":")[1] for v in compose["volumes"]}
    assert compose_mounts == {"/cache", "/models"}
    assert compose.get("ipc") == "host"                                   # the shared memory /dev/shm gives pods
    pvcs = {k.split("/")[1] for k in base() if k.startswith("PersistentVolumeClaim/")}
    lws = component("multinode")["LeaderWorkerSet/turingbox"]["spec"]["leaderWorkerTemplate"]
    pods = [(w, p["spec"], c) for w, p, c in pod_containers()] + \
        [("lws worker", lws["workerTemplate"]["spec"], lws["workerTemplate"]["spec"]["containers"][0])]
    reference = None
    for where, spec, c in pods:
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert compose_mounts | {"/tmp", "/dev/shm"} == set(mounts), where
        volumes = {v["name"]: v for v in spec["volumes"]}
        claims = {volumes[mounts[p]]["persistentVolumeClaim"]["claimName"] for p in ("/cache", "/models")}
        assert claims == pvcs == {"turingbox-cache", "turingbox-models"}, where
        shape = {p: {k: v for k, v in volumes[n].items() if k != "name"} for p, n in mounts.items()}
        reference = reference or shape
        assert shape == reference, f"{where} mounts differ from the Deployment's"


def test_environment_agrees(compose):
    config = base()["ConfigMap/turingbox"]["data"]
    passed = {e.split("=", 1)[0] for e in compose["environment"]}
    assert set(config) <= passed, "a setting the ConfigMap sets that compose cannot pass"
    lws = component("multinode")["LeaderWorkerSet/turingbox"]["spec"]["leaderWorkerTemplate"]
    dep = pod_containers()[0][2]
    for where, c in (("lws leader", lws["leaderTemplate"]["spec"]["containers"][0]),
                     ("lws worker", lws["workerTemplate"]["spec"]["containers"][0])):
        assert c["envFrom"] == dep["envFrom"], where
        assert c["image"] == dep["image"] and c["securityContext"] == dep["securityContext"], where
    # TP per node is the same on every pod of a group, and the GPUs each pod asks for match it
    for c in (lws["leaderTemplate"]["spec"]["containers"][0], lws["workerTemplate"]["spec"]["containers"][0]):
        tp = {e["name"]: e["value"] for e in c["env"]}["TURINGBOX_TP"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == int(tp)


def test_the_pool_and_its_picker_point_at_each_other():
    gw = component("inference-gateway")
    pool = gw["InferencePool/turingbox"]["spec"]
    dep_labels = base()["Deployment/turingbox"]["spec"]["template"]["metadata"]["labels"]
    assert pool["selector"]["matchLabels"].items() <= dep_labels.items()
    ref = pool["endpointPickerRef"]
    svc = gw[f"Service/{ref['name']}"]["spec"]
    assert ref["port"]["number"] in [p["port"] for p in svc["ports"]]
    epp = gw["Deployment/turingbox-epp"]["spec"]["template"]
    assert svc["selector"].items() <= epp["metadata"]["labels"].items()
    args = epp["spec"]["containers"][0]["args"]
    assert args[args.index("--pool-name") + 1] == "turingbox"
    objective = gw["InferenceObjective/turingbox-interactive"]["spec"]
    assert objective["poolRef"]["name"] == "turingbox"
    role = gw["Role/turingbox-epp"]["rules"]
    assert {"inferencepools"} <= {r for rule in role for r in rule["resources"]}
