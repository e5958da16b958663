"""The appliance image, built from the real Dockerfile and run without a GPU (make test-image)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
import tomllib

import httpx
import pytest

from tests.support.docker_image import REPO, docker, free_port, unique

pytestmark = pytest.mark.docker

FIXTURE_GPUS = os.path.join(REPO, "tests", "fixtures", "gpus")
SEED_MACHINE = "4x2080ti-22g.json"
UID = "10001"


def project_version() -> str:
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["version"]


def wait_http(url: str, want: int, timeout: float, name: str) -> httpx.Response:
    """Poll url until it answers with status `want`; fail with the container's log otherwise."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(url, timeout=2.0)
            if last.status_code == want:
                return last
        except httpx.HTTPError as exc:
            last = exc
        if docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip() != "true":
            break
        time.sleep(0.5)  # poll: until the answer, the container's exit or the deadline
    logs = docker("logs", name, check=False)
    pytest.fail(f"{url} never answered {want} (last: {last!r}); container log:\n"
                f"{logs.stdout[-4000:]}\n{logs.stderr[-4000:]}")


def assert_no_traceback(text: str) -> None:
    assert "Traceback (most recent call last)" not in text, text[-4000:]


# ---- what the image is -----------------------------------------------------------------------

def test_entrypoint_user_health_volumes_and_labels(image_config):
    cfg = image_config["Config"]
    assert cfg["Entrypoint"] == ["tini", "--", "python3", "-P", "-m", "turingbox"]   # tests/image/test_image_entrypoint.py
    assert cfg["Cmd"] == ["serve"]
    assert cfg["User"].split(":")[0] == UID
    assert set(cfg["Volumes"]) == {"/cache", "/models"}
    assert "/health/live" in " ".join(cfg["Healthcheck"]["Test"])
    labels = cfg["Labels"]
    assert labels["org.opencontainers.image.version"] == project_version()
    assert labels["org.opencontainers.image.base.name"]
    env = dict(item.split("=", 1) for item in cfg["Env"])
    assert env["TURINGBOX_CACHE_DIR"] == "/cache" and env["TURINGBOX_MODELS_DIR"] == "/models"
    assert env["TRITON_PTXAS_PATH"].endswith("/ptxas")


def test_labels_match_the_installed_stack(image, image_config):
    labels = image_config["Config"]["Labels"]
    code = ("import json, importlib.metadata as m; print(json.dumps({n: m.version(n) for n in "
            "('vllm', 'torch', 'triton', 'flashinfer-python', 'turingbox', 'turingbox-plugin')}))")
    r = docker("run", "--rm", "--entrypoint", "python3", image, "-c", code)
    installed = json.loads(r.stdout)
    assert installed["vllm"] == labels["org.turingbox.vllm.version"] == "0.21.0"
    assert installed["torch"].split("+")[0] == labels["org.turingbox.torch.version"]
    assert installed["triton"] == labels["org.turingbox.triton.version"]
    assert installed["flashinfer-python"] == labels["org.turingbox.flashinfer.version"]
    assert installed["turingbox"] == installed["turingbox-plugin"] == project_version()
    # the lock is what got installed
    with open(os.path.join(REPO, "requirements", "image-lock.txt")) as f:
        lock = f.read()
    for name in ("vllm", "torch", "triton", "flashinfer-python"):
        assert f"\n{name}=={installed[name].split('+')[0]}\n" in lock


def test_runs_as_non_root_and_build_ca_is_not_left_behind(image):
    r = docker("run", "--rm", "--entrypoint", "sh", image, "-c",
               "id -u; id -g; ls /usr/local/share/ca-certificates/; command -v tini; turingbox --version")
    lines = r.stdout.split()
    assert lines[0] == UID and lines[1] == UID
    assert "turingbox-build-extra.crt" not in r.stdout
    assert "tini" in r.stdout and project_version() in r.stdout


BAKED_KERNELS = {"_zero_kv_blocks_kernel", "_compute_slot_mapping_kernel", "eagle_prepare_next_token_padded_kernel",
                 "eagle_step_slot_mapping_metadata_kernel", "eagle_prepare_inputs_padded_kernel",
                 "rejection_greedy_sample_kernel", "_copy_page_indices_kernel", "scaled_copy_kernel"}


def test_baked_sm75_triton_cache_is_present(image, image_config):
    """The AOT step compiled vLLM 0.21's first-request kernels and the plugin's for every arch, sm_75
    included, into a read-only /opt/turingbox/triton-cache that new cache entries start from."""
    code = r"""
import glob, json, os, collections
root = '/opt/turingbox/triton-cache'
kernels = collections.defaultdict(lambda: collections.Counter())
cubins = 0
for meta in glob.glob(os.path.join(root, '*', '*.json')):
    if os.path.basename(meta).startswith('__grp__'):
        continue
    with open(meta) as f:
        data = json.load(f)
    target = data.get('target') or {}
    if target.get('backend') == 'cuda':
        kernels[target['arch']][data['name']] += 1
        cubins += os.path.isfile(meta[:-len('.json')] + '.cubin')
print(json.dumps({'kernels': kernels, 'cubins': cubins, 'writable': os.access(root, os.W_OK)}))
"""
    r = docker("run", "--rm", "--entrypoint", "python3", image, "-c", code)
    found = json.loads(r.stdout)
    kernels = {int(arch): names for arch, names in found["kernels"].items()}
    assert kernels.get(75), (
        f"no sm_75 kernels baked ({found}): the Dockerfile's `turingbox_warmup.image.triton_aot` step compiled nothing — "
        "are the specializations shipped in the turingbox_warmup.image package (aot_specs/*.jsonl)?")
    for arch in (75, 80, 86, 89, 90):
        missing = BAKED_KERNELS - set(kernels.get(arch, {}))
        assert not missing, f"sm_{arch} lacks baked {sorted(missing)}"
    # several specializations per kernel (batch-size classes, plans, greedy and mixed sampling)
    assert kernels[75]["rejection_greedy_sample_kernel"] >= 2 and kernels[75]["_zero_kv_blocks_kernel"] >= 3
    assert found["cubins"] == sum(sum(n.values()) for n in kernels.values()), found
    assert not found["writable"], "the baked cache should be a read-only layer for the runtime user"
    env = dict(e.split("=", 1) for e in image_config["Config"]["Env"])
    assert env.get("TURINGBOX_AOT_TRITON_DIR") == "/opt/turingbox/triton-cache"


def test_vllm_takes_the_baked_model_infos_instead_of_inspecting(image, image_config):
    """The build's model infos are what the image's vLLM accepts: with them as VLLM_CACHE_ROOT (a copy, as a new
    cache entry gets) its registry answers without importing the class in a subprocess; with an empty
    VLLM_CACHE_ROOT (the control) it does import."""
    code = r"""
import json, os, shutil, sys, tempfile
src = os.environ['TURINGBOX_AOT_MODELINFOS_DIR']
entry = tempfile.mkdtemp()
shutil.copytree(os.path.join(src, 'modelinfos'), os.path.join(entry, 'modelinfos'))
os.environ['VLLM_CACHE_ROOT'] = entry if sys.argv[1] == 'copy' else tempfile.mkdtemp()
from vllm.model_executor.models import registry
inspected = []
def no_subprocess(fn):
    inspected.append(1)
    raise RuntimeError('inspected in a subprocess')
registry._run_in_subprocess = no_subprocess
out = {}
for arch in ('Qwen3_5ForConditionalGeneration', 'Qwen3_5MTP'):
    try:
        info = registry.ModelRegistry._try_inspect_model_cls(arch)
    except RuntimeError:
        info = None
    out[arch] = None if info is None else {'is_hybrid': info.is_hybrid, 'supports_multimodal': info.supports_multimodal}
print(json.dumps({'infos': out, 'subprocesses': len(inspected), 'files': sorted(os.listdir(os.path.join(src, 'modelinfos')))}))
"""
    env = dict(e.split("=", 1) for e in image_config["Config"]["Env"])
    assert env.get("TURINGBOX_AOT_MODELINFOS_DIR") == "/opt/turingbox/vllm-modelinfos"
    runs = {}
    for mode in ("copy", "empty"):
        r = docker("run", "--rm", "--entrypoint", "python3", image, "-c", code, mode)
        runs[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    assert runs["copy"]["subprocesses"] == 0, runs["copy"]
    assert runs["copy"]["infos"]["Qwen3_5ForConditionalGeneration"] == {"is_hybrid": True, "supports_multimodal": True}
    assert runs["copy"]["infos"]["Qwen3_5MTP"] is not None and len(runs["copy"]["files"]) == 2
    assert runs["empty"]["subprocesses"] == 2, runs["empty"]          # the control: vLLM's own slow path


def test_demo_tokenizer_is_prebuilt(image):
    r = docker("run", "--rm", "--entrypoint", "sh", image, "-c", "ls /models/.turingbox-tokenizer/*/")
    assert "tokenizer.json" in r.stdout, r.stdout


# ---- what it does without a GPU --------------------------------------------------------------

def test_plan_for_the_seed_machine(image):
    """`turingbox plan --gpus-json` for 4x RTX 2080 Ti 22 GB with the AWQ demo model, inside the image."""
    with open(os.path.join(FIXTURE_GPUS, SEED_MACHINE)) as f:
        gpus = json.load(f)
    r = docker("run", "--rm", "-v", f"{FIXTURE_GPUS}:/fixtures:ro", "-e", "TURINGBOX_DEMO_AWQ=1",
               image, "plan", "--gpus-json", f"/fixtures/{SEED_MACHINE}", "--json", timeout=600)
    assert_no_traceback(r.stderr)
    plan = json.loads(r.stdout)
    assert plan["tensor_parallel_size"] == 4
    assert plan["gpus"] == [g["uuid"] for g in sorted(gpus, key=lambda g: g["pci_bus_id"])]
    assert plan["compute_capability"] == "7.5"
    assert plan["attention_backend"] == "FLASHINFER"
    assert plan["demo"] is True and plan["quantization"] == "awq"
    assert plan["model"].startswith("/models/")
    assert plan["vllm_args"][:2] == ["serve", plan["model"]]
    # the fingerprint sees the image's real serving stack
    assert plan["cache_inputs"]["software"]["vllm"] == "0.21.0"
    assert plan["cache_key"]


# A start without a GPU ends the container: one sentence on stderr, liveness 503, exit 2.
NO_GPU_SENTENCE = re.compile(r"^turingbox: no (NVIDIA )?GPU\b.*", re.MULTILINE)
EXIT_UNPLANNABLE = 2

# The sidecar on a simulated H200 with a vLLM stand-in that never answers: serve plans, prepares the
# caches, launches the stand-in (which takes vLLM's argv and sleeps) and waits for it, live and not ready.
STAND_IN_VLLM = "python3 -c 'import sys, time; time.sleep(3600)'"  # behaviour: a vLLM that never answers


def stand_in_args(fixture: str = "1xh200.json") -> list[str]:
    return ["-v", f"{FIXTURE_GPUS}:/fixtures:ro", "-e", f"TURINGBOX_GPUS_JSON=/fixtures/{fixture}",
            "-e", f"TURINGBOX_VLLM_COMMAND={STAND_IN_VLLM}"]


def container_logs(name: str) -> str:
    logs = docker("logs", name, check=False)
    return logs.stdout + logs.stderr


def wait_log(name: str, needle: str, timeout: float) -> str:
    """Poll the container's log until needle shows up (while it runs); fail with the log otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        out = container_logs(name)
        if needle in out:
            return out
        running = docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip() == "true"
        if not running or time.monotonic() > deadline:
            pytest.fail(f"{needle!r} never appeared in the log of {name} (running: {running}):\n{out[-4000:]}")
        time.sleep(0.5)  # poll: until the line, the container's exit or the deadline


def wait_exit(name: str, timeout: float) -> dict:
    """The container's State once it has exited on its own (no stop, no kill); fail after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        state = json.loads(docker("inspect", "-f", "{{json .State}}", name).stdout)
        if state["Status"] == "exited":
            return state
        if time.monotonic() > deadline:
            pytest.fail(f"{name} is still {state['Status']} after {timeout:.0f} s:\n{container_logs(name)[-4000:]}")
        time.sleep(0.5)  # poll: until the exit or the deadline


def assert_live_not_ready_then_stops(name: str, base: str) -> str:
    """The stand-in runs: live 200 in stage starting, ready 503; SIGTERM through tini exits 0 promptly."""
    wait_log(name, "starting vLLM: python3 -c", 180)
    live = httpx.get(f"{base}/health/live", timeout=5)
    assert live.status_code == 200, live.text
    assert live.json() == {"status": "alive", "stage": "starting"}, live.text
    ready = httpx.get(f"{base}/health/ready", timeout=5)
    assert ready.status_code == 503, ready.text
    assert ready.json()["stage"] == "starting", ready.text
    assert ready.headers.get("retry-after"), ready.headers
    # the stand-in is vLLM's process: it got the plan's argv after the command line
    top = docker("top", name, "-eo", "pid,args").stdout
    assert re.search(r"python3 -c import sys, time; time.sleep\(3600\) serve ", top), top
    started = time.monotonic()
    docker("stop", "-t", "60", name, timeout=120)                     # SIGTERM through tini
    stop_s = time.monotonic() - started
    state = json.loads(docker("inspect", "-f", "{{json .State}}", name).stdout)
    logs = container_logs(name)
    assert state["ExitCode"] == 0, (state, logs[-4000:])
    assert not state["OOMKilled"]
    assert stop_s < 30, f"SIGTERM took {stop_s:.1f} s: it was not handled (killed at the timeout?)"
    assert "SIGTERM received: draining" in logs and "drained: exiting" in logs, logs[-4000:]
    assert_no_traceback(logs)
    return logs


def test_serve_without_gpu_exits_2_with_one_sentence(image, container):
    """No GPU: liveness turns 503 with the reason, the sentence is printed once, the container exits 2."""
    port = free_port()
    # a linger long enough to see liveness 503 from here; the compose test covers the default (2 s)
    name = container("-p", f"127.0.0.1:{port}:8000", "-e", "TURINGBOX_EXIT_LINGER_SECONDS=15", image)
    started = time.monotonic()
    dead = wait_http(f"http://127.0.0.1:{port}/health/live", 503, 60, name)
    assert dead.json()["status"] == "dead" and re.search(r"GPU", dead.json()["reason"]), dead.text
    ready = httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=5)
    assert ready.status_code == 503 and ready.json()["stage"] == "failed", ready.text
    state = wait_exit(name, 60)
    elapsed = time.monotonic() - started
    logs = docker("logs", name)
    assert state["ExitCode"] == EXIT_UNPLANNABLE, (state, logs.stdout[-3000:], logs.stderr[-3000:])
    assert not state["OOMKilled"]
    assert elapsed < 60, f"exited only after {elapsed:.0f} s"
    lines = [m.group(0) for m in NO_GPU_SENTENCE.finditer(logs.stderr)]
    assert len(lines) == 1, logs.stderr[-3000:]
    assert lines[0].endswith("."), lines
    assert lines[0][len("turingbox: "):] == dead.json()["reason"], (lines, dead.text)   # the same sentence
    assert_no_traceback(logs.stdout + logs.stderr)


def test_serve_without_gpu_exits_2_after_the_default_linger(image, container):
    """The default TURINGBOX_EXIT_LINGER_SECONDS (2 s): the container ends on its own, quickly."""
    name = container(image)
    state = wait_exit(name, 60)
    logs = docker("logs", name)
    assert state["ExitCode"] == EXIT_UNPLANNABLE, (state, logs.stderr[-3000:])
    assert len(NO_GPU_SENTENCE.findall(logs.stderr)) == 1, logs.stderr[-3000:]
    assert_no_traceback(logs.stdout + logs.stderr)


def test_serve_with_a_stand_in_vllm_is_live_not_ready_and_stops_cleanly(image, container):
    """A simulated H200 and a vLLM that never answers: live, not ready; SIGTERM through tini exits 0."""
    port = free_port()
    name = container("-p", f"127.0.0.1:{port}:8000", *stand_in_args(), image)
    logs = assert_live_not_ready_then_stops(name, f"http://127.0.0.1:{port}")
    assert not re.search(r"^turingbox: ", logs, re.MULTILINE), logs[-3000:]   # stopped, not failed: no sentence
    assert "vLLM stopped" in logs, logs[-3000:]


def test_doctor_reports_failures_without_traceback(image):
    r = docker("run", "--rm", image, "doctor", check=False, timeout=300)
    assert r.returncode == 1, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    out = r.stdout + r.stderr
    assert re.search(r"^\s*FAIL\b", out, re.MULTILINE), out[-3000:]
    assert_no_traceback(out)


def test_read_only_root_filesystem(image, volume, container):
    """--read-only with writable /tmp, /cache, /models (as the Kubernetes manifests run it): the demo model,
    then serve on a simulated H200 with the vLLM stand-in (plan, demo dir, cache preparation, runtime dir).
    `volume` comes before `container`: the containers are removed first, then their volumes can be."""
    cache, models = volume(), volume()
    mounts = ["--read-only", "--tmpfs", "/tmp", "-v", f"{cache}:/cache", "-v", f"{models}:/models"]
    r = docker("run", "--rm", *mounts, image, "demo-model", timeout=300)
    assert "demo model ready" in r.stdout, r.stdout + r.stderr
    assert_no_traceback(r.stderr)
    port = free_port()
    name = container(*mounts, *stand_in_args(), "-p", f"127.0.0.1:{port}:8000", image)
    logs = assert_live_not_ready_then_stops(name, f"http://127.0.0.1:{port}")
    assert "Read-only file system" not in logs, logs[-3000:]
    assert "compile caches unavailable" not in logs, logs[-3000:]     # /cache stayed usable


# ---- compose ---------------------------------------------------------------------------------

def compose_command() -> list[str]:
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    pytest.fail("compose.cpu.yaml needs Docker Compose v2 (`docker compose`); tools/ci/install-docker-tools.sh "
                "installs it")


def test_compose_cpu_override_up_exits_2_down(image):
    """compose.yaml + compose.cpu.yaml without a GPU: up succeeds, serve says why and exits 2 (restart "no"
    leaves it exited for `docker compose logs`), the volumes and ipc are compose.yaml's, no GPU reservation;
    `down -v` leaves nothing behind."""
    project = unique("turingbox-test")
    port = free_port()
    env = {**os.environ, "TURINGBOX_IMAGE": image, "TURINGBOX_PORT": str(port),
           "TURINGBOX_BIND_ADDRESS": "127.0.0.1"}
    compose = [*compose_command(), "-p", project, "-f", os.path.join(REPO, "compose.yaml"),
               "-f", os.path.join(REPO, "compose.cpu.yaml")]
    up = subprocess.run([*compose, "up", "-d"], capture_output=True, text=True, env=env, timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        cid = subprocess.run([*compose, "ps", "-a", "-q", "turingbox"], capture_output=True, text=True, env=env,
                             check=True).stdout.strip()
        assert cid, subprocess.run([*compose, "ps", "-a"], capture_output=True, text=True, env=env).stdout
        state = wait_exit(cid, 60)
        assert state["ExitCode"] == EXIT_UNPLANNABLE, (state, container_logs(cid)[-3000:])
        # restart "no": Docker leaves it exited (the policy says so, and it was not restarted since)
        policy = json.loads(docker("inspect", "-f", "{{json .HostConfig.RestartPolicy}}", cid).stdout)
        assert policy["Name"] in ("no", ""), policy
        again = json.loads(docker("inspect", "-f", "{{json .}}", cid).stdout)
        assert again["RestartCount"] == 0, again["RestartCount"]
        assert again["State"]["Status"] == "exited" and again["State"]["StartedAt"] == state["StartedAt"], again["State"]
        logs = docker("logs", cid)
        assert len(NO_GPU_SENTENCE.findall(logs.stderr)) == 1, logs.stderr[-3000:]
        assert_no_traceback(logs.stdout + logs.stderr)
        # and `docker compose logs` shows it (its output may carry terminal escapes: dropped here)
        shown = subprocess.run([*compose, "logs", "--no-color", "--no-log-prefix", "turingbox"], capture_output=True,
                               text=True, env=env, timeout=60)
        shown_text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", shown.stdout + shown.stderr)
        assert len(NO_GPU_SENTENCE.findall(shown_text)) == 1, shown_text[-3000:]
        mounts = {m["Destination"]: m for m in json.loads(docker("inspect", "-f", "{{json .Mounts}}", cid).stdout)}
        assert mounts["/cache"]["Type"] == mounts["/models"]["Type"] == "volume"
        assert mounts["/cache"]["Name"] == f"{project}_turingbox-cache", mounts["/cache"]
        assert mounts["/models"]["Name"] == f"{project}_turingbox-models", mounts["/models"]
        host_config = json.loads(docker("inspect", "-f", "{{json .HostConfig}}", cid).stdout)
        assert host_config["IpcMode"] == "host"
        assert not host_config.get("DeviceRequests"), "the CPU override must drop the GPU reservation"
        assert host_config["RestartPolicy"]["Name"] == "no", host_config["RestartPolicy"]
    finally:
        down = subprocess.run([*compose, "down", "-v", "--timeout", "60"], capture_output=True, text=True,
                              env=env, timeout=300)
    assert down.returncode == 0, down.stderr
    left = docker("ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={project}").stdout.strip()
    assert left == ""
    volumes = docker("volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={project}").stdout.strip()
    assert volumes == "", volumes


def test_compose_gpu_file_requests_gpus(image):
    """Without the override, the service reserves NVIDIA GPUs (count from TURINGBOX_GPU_COUNT)."""
    env = {**os.environ, "TURINGBOX_IMAGE": image, "TURINGBOX_GPU_COUNT": "2"}
    r = subprocess.run([*compose_command(), "-f", os.path.join(REPO, "compose.yaml"), "config", "--format", "json"],
                       capture_output=True, text=True, env=env, check=True)
    service = json.loads(r.stdout)["services"]["turingbox"]
    device = service["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"] and int(device["count"]) == 2


# ---- the plugin's tests that need vLLM, run where vLLM is installed ----------------------------

# What the plugin tests need beyond the image (the dev extras they use), at this machine's versions.
TEST_TOOLS = ("pytest", "pytest-timeout", "hypothesis", "matplotlib")
VERIFY_ARCHS = "tests/turingbox_plugin/test_verify_archs.py"


def test_plugin_tests_pass_inside_the_image(image):
    """tests/turingbox_plugin (less gdn/, as before the move: its kernels are tested on the host) inside the image, where vLLM 0.21.0 is importable (they skip those parts on the host)."""
    from importlib.metadata import version
    tag = f"{image}-pytest"
    pins = " ".join(f"{name}=={version(name)}" for name in TEST_TOOLS)
    dockerfile = (f"FROM {image}\nUSER root\n"
                  "RUN PIP_CERT=/etc/ssl/certs/ca-certificates.crt pip install --no-cache-dir "
                  f"--disable-pip-version-check {pins}\nUSER 10001:10001\n")
    build = subprocess.run(["docker", "build", "-t", tag, "-"], input=dockerfile, capture_output=True, text=True,
                           timeout=600, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    try:
        assert build.returncode == 0, build.stderr[-3000:]
        mounts = ["-v", f"{REPO}/tests:/src/tests:ro", "-v", f"{REPO}/pyproject.toml:/src/pyproject.toml:ro"]
        runs = []
        # Two runs, each with its own limit: `verify --compile-only` for each of the seven archs builds every
        # kernel the image bakes (more than on the host, where vLLM is not importable) and takes most of the
        # time; one 900 s limit for all of it ran out on CI's 2 cores while the tests were still passing.
        for selection, limit in ((["tests/turingbox_plugin", "--ignore=tests/turingbox_plugin/gdn", f"--ignore={VERIFY_ARCHS}"], 900), ([VERIFY_ARCHS], 2400)):
            runs.append(docker("run", "--rm", *mounts, "--tmpfs", "/tmp", "-w", "/src", "--entrypoint", "python3",
                               tag, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--durations=10", *selection,
                               "-m", "not gpu and not docker", "-o", "addopts=", check=False, timeout=limit))
    finally:
        # a throwaway layer of test tools on the image under test: not left behind (a failed build tags nothing)
        docker("image", "rm", tag, check=False)
    for r in runs:
        summary = r.stdout[-3000:]
        assert r.returncode == 0, summary + r.stderr[-2000:]
        assert re.search(r"\d+ passed", summary), summary
