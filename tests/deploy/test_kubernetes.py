"""Every shipped kustomization renders with kustomize and every object it makes validates: built-in kinds with
kubernetes-validate, the CRD kinds against the vendored CRD schemas (deploy/kubernetes/schemas)."""
from __future__ import annotations

import copy
import os

import pytest

from tests.deploy.deploy_helpers import K8S, by_kind, k8s_validate, load, need

COMPONENTS = sorted(os.listdir(os.path.join(K8S, "components")))
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "ScaledObject", "InferencePool", "InferenceObjective", "LeaderWorkerSet"}


@pytest.fixture(scope="module")
def rendered():
    need("kubectl")
    return k8s_validate.targets()


def test_every_component_is_an_optional_kustomize_component():
    assert set(COMPONENTS) == {"servicemonitor", "keda", "inference-gateway", "multinode"}
    for c in COMPONENTS:
        (k,) = load(os.path.join(K8S, "components", c, "kustomization.yaml"))
        assert (k["apiVersion"], k["kind"]) == ("kustomize.config.k8s.io/v1alpha1", "Component"), c


def test_every_target_renders_and_validates(rendered):
    assert set(rendered) >= {"base", *(f"base+{c}" for c in COMPONENTS), "overlays/replicas", "overlays/multinode"}
    seen_crds = set()
    for name, objects in rendered.items():
        assert objects, name
        for obj in objects:
            how = k8s_validate.validate(obj)          # raises with the path of the first error
            if how == "crd":
                seen_crds.add(obj["kind"])
    assert seen_crds == CRD_KINDS                    # each vendored schema was used, no CRD went unchecked


def test_the_base_alone_is_unchanged_by_the_components(rendered):
    base = by_kind(rendered["base"])
    for c in ("servicemonitor", "inference-gateway"):
        with_c = by_kind(rendered[f"base+{c}"])
        assert {k: v for k, v in with_c.items() if k in base} == base, c


def test_keda_owns_the_replica_count(rendered):
    objs = by_kind(rendered["base+keda"])
    assert "replicas" not in objs["Deployment/turingbox"]["spec"]
    assert by_kind(rendered["base"])["Deployment/turingbox"]["spec"]["replicas"] == 1
    so = objs["ScaledObject/turingbox"]["spec"]
    assert so["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "turingbox"}
    assert so["minReplicaCount"] >= 1                # scale to zero would make a user wait for a whole start


def test_multinode_replaces_the_deployment_and_serves_from_leaders_only(rendered):
    objs = by_kind(rendered["base+multinode"])
    assert "Deployment/turingbox" not in objs
    lws = objs["LeaderWorkerSet/turingbox"]["spec"]["leaderWorkerTemplate"]
    svc = objs["Service/turingbox"]["spec"]["selector"]
    assert svc == {"app.kubernetes.io/name": "turingbox", "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    leader_labels = lws["leaderTemplate"]["metadata"]["labels"]
    worker_labels = lws["workerTemplate"]["metadata"]["labels"]
    assert leader_labels["app.kubernetes.io/name"] == "turingbox"
    assert worker_labels["app.kubernetes.io/name"] != "turingbox"      # no worker behind the Service or a pool
    leader_cmd = " ".join(lws["leaderTemplate"]["spec"]["containers"][0]["args"])
    assert "--distributed-executor-backend ray" in leader_cmd and "--pipeline-parallel-size" in leader_cmd
    worker_cmd = " ".join(lws["workerTemplate"]["spec"]["containers"][0]["args"])
    assert "LWS_LEADER_ADDRESS" in worker_cmd and "--block" in worker_cmd


# -- the schemas catch what they should (so a green run means something)

def _mutated(rendered, target: str, key: str, mutate):
    obj = copy.deepcopy(by_kind(rendered[target])[key])
    mutate(obj)
    return obj


@pytest.mark.parametrize("target,key,mutate,where", [
    ("base+inference-gateway", "InferencePool/turingbox",
     lambda o: o["spec"].__setitem__("targetPortNumber", 8000), "targetPortNumber. was unexpected"),          # the pre-v1 field
    ("base+inference-gateway", "InferencePool/turingbox",
     lambda o: o["spec"]["targetPorts"].append({"number": 8000}), "unique"),
    ("base+inference-gateway", "InferencePool/turingbox",
     lambda o: o["spec"]["endpointPickerRef"].pop("port"), "port is required"),
    ("base+inference-gateway", "InferencePool/turingbox",
     lambda o: o["spec"]["endpointPickerRef"].__setitem__("failureMode", "Open"), "FailOpen"),
    ("base+keda", "ScaledObject/turingbox", lambda o: o["spec"].pop("triggers"), "triggers"),
    ("base+keda", "ScaledObject/turingbox",
     lambda o: o["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"].__setitem__(
         "policies", [{"type": "Pods", "value": "one", "periodSeconds": 60}]), "spec.advanced"),
    ("base+servicemonitor", "ServiceMonitor/turingbox",
     lambda o: o["spec"]["endpoints"][0].__setitem__("interval", "15 seconds"), "interval"),
    ("base+servicemonitor", "PrometheusRule/turingbox",
     lambda o: o["spec"]["groups"][0]["rules"][0].pop("expr"), "expr"),
    ("base+multinode", "LeaderWorkerSet/turingbox",                      # inside the referenced PodTemplateSpec
     lambda o: o["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0].__setitem__("imagee", "x"),
     "workerTemplate"),
    ("base+multinode", "LeaderWorkerSet/turingbox",
     lambda o: o["spec"]["leaderWorkerTemplate"].__setitem__("restartPolicy", "Always"), "restartPolicy"),
    ("base", "Deployment/turingbox",
     lambda o: o["spec"]["template"]["spec"]["containers"][0].__setitem__("ports", [{"containerPort": "8000"}]),
     "containerPort"),
])
def test_a_broken_object_is_refused(rendered, target, key, mutate, where):
    with pytest.raises(k8s_validate.ValidationError, match=where):
        k8s_validate.validate(_mutated(rendered, target, key, mutate))


def test_an_unknown_kind_is_an_error_not_a_pass():
    with pytest.raises(k8s_validate.ValidationError, match="no schema"):
        k8s_validate.validate({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                               "metadata": {"name": "x"}, "spec": {}})
