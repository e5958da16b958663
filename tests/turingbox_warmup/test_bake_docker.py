"""`make bake` with the real Docker engine: bake a synthetic entry with a correct manifest into an
image (from a directory, a tarball and a named volume), then start the derived image without a
GPU and check that the entry is found, verified, reported and used; refusals build nothing.

The base is a tiny image (tests/turingbox_warmup/python_image.py; docker import of a minimal file tree),
or the appliance itself with TURINGBOX_BAKE_TEST_IMAGE=turingbox:0.1.0.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import uuid

import pytest

from turingbox_warmup import bake
from turingbox.cache import store
from tests.support.plan_factory import cache_settings

pytestmark = pytest.mark.docker

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H200 = os.path.join(REPO, "tests", "fixtures", "gpus", "1xh200.json")
TWO_H200 = os.path.join(REPO, "tests", "fixtures", "gpus", "2xh200.json")
FILES = {"triton/ABCD/_zero_kv_blocks_kernel.cubin": b"\x7fELF" + b"\1" * 1020,
         "triton/ABCD/_zero_kv_blocks_kernel.json": b'{"name": "_zero_kv_blocks_kernel"}',
         "vllm/torch_compile_cache/h/rank_0_0/backbone/artifact": b"G" * 2048}


@pytest.fixture(scope="module")
def client():
    docker = pytest.importorskip("docker")
    try:
        c = docker.from_env()
        c.ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine: {exc}")
    return c


@pytest.fixture(scope="module")
def base(client):
    image = os.environ.get("TURINGBOX_BAKE_TEST_IMAGE")
    if image:
        yield image                       # the operator's image: never removed
        return
    from tests.turingbox_warmup import python_image
    why = python_image.available()
    if why:
        pytest.skip(why)
    before = {t for img in client.images.list(name=python_image.REPOSITORY) for t in img.tags}
    tag = python_image.ensure(client)
    yield tag
    # The tiny base is a throwaway: remove it when this run built it (an existing one of the same contents may be
    # a concurrent run's). The derived images, built FROM it, are gone already (the function-scoped `made`).
    if tag not in before:
        try:
            client.images.remove(tag)
        except Exception as exc:  # noqa: BLE001 - cleanup must not turn a passing run into an error
            print(f"could not remove the test base image {tag}: {exc}")


@pytest.fixture(scope="module")
def plan(client, base):
    """The plan the base image makes for one H200 (its own software versions)."""
    return bake.image_plan(client, base, H200, {})


@pytest.fixture
def made(client):
    """Images and volumes a test created, removed afterwards."""
    things = {"images": [], "volumes": []}
    yield things
    for tag in things["images"]:
        try:
            client.images.remove(tag, force=True)
        except Exception:
            pass
    for name in things["volumes"]:
        try:
            client.volumes.get(name).remove(force=True)
        except Exception:
            pass


def seed_entry(plan, root, complete=True):
    s = store.prepare_cache(plan, cache_settings(str(root)), min_free_bytes=0)
    for rel, data in FILES.items():
        path = os.path.join(s.entry, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    s.finish(complete)
    return s.entry


def run_bake(*args, env=None):
    return subprocess.run([sys.executable, "-m", "turingbox_warmup.bake", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def in_image(client, image, *args, user="10001:10001", gpus=None):
    """`turingbox ARGS` in a container of image, without GPU or network; (exit code, stdout, stderr)."""
    container = client.containers.create(image, command=list(args), network_disabled=True, user=user)
    try:
        if gpus:
            container.put_archive("/tmp", bake._tar_bytes({"gpus.json": open(gpus, "rb").read()}))
        container.start()
        code = container.wait(timeout=120)["StatusCode"]
        return (code, container.logs(stdout=True, stderr=False).decode(),
                container.logs(stdout=False, stderr=True).decode())
    finally:
        container.remove(force=True)


def check_derived(client, tag, plan):
    key = plan["cache_key"]
    image = client.images.get(tag)
    labels = image.labels
    assert labels["org.turingbox.cache.key"] == key
    assert json.loads(labels["org.turingbox.cache.inputs"]) == plan["cache_inputs"]
    assert labels["org.turingbox.cache.inputs.gpu_name"] == "NVIDIA H200"
    assert labels["org.turingbox.cache.inputs.plan.num_speculative_tokens"] == str(plan["num_speculative_tokens"])

    # Found and verified: `turingbox cache show --json` inside the derived image, as the service user.
    code, out, err = in_image(client, tag, "cache", "show", "--json")
    assert code == 0, err
    shown = json.loads(out)
    baked = shown["baked"]
    assert [e["key"] for e in baked["entries"]] == [key]          # exactly that entry
    row = baked["entries"][0]
    assert row["complete"] and row["verified"] and row["problems"] == []
    assert row["sizes"]["triton"] == {"files": 2, "bytes": 1024 + len(FILES["triton/ABCD/_zero_kv_blocks_kernel.json"])}
    assert row["inputs"] == plan["cache_inputs"]
    code, out, _ = in_image(client, tag, "cache", "verify", "--baked", "--json")
    assert code == 0 and json.loads(out)["entries"][key]["ok"]

    # Used at start: the runtime's cache step copies it into the (writable) cache and says so.
    code, out, err = in_image(client, tag, "warmup", "--gpus-json", "/tmp/gpus.json", gpus=H200)
    assert code == 0, err
    assert f"cache hit for {key} (shared entry /cache/entries/{key}, from baked): vllm hit, triton hit" in out
    result = json.loads(out.split("turingbox-seed-result: ", 1)[1])
    assert result["result"] == "hit" and result["sizes"]["triton"]["files"] == 2


def test_bake_from_a_directory_then_the_derived_image_finds_verifies_and_uses_the_entry(client, base, plan, made,
                                                                                       tmp_path):
    seed_entry(plan, tmp_path / "seeds")
    other = json.loads(json.dumps(plan))
    other["cache_inputs"]["plan"]["num_speculative_tokens"] += 1   # a second entry that must stay out
    del other["cache_key"]
    seed_entry(other, tmp_path / "seeds")
    r = run_bake("--image", base, "--from-dir", str(tmp_path / "seeds"), "--gpus-json", H200, "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    made["images"].append(result["image"])
    assert result["cache_key"] == plan["cache_key"]
    assert result["image"] == bake.derived_tag(base, plan["cache_key"], "0.1.0")
    check_derived(client, result["image"], plan)

    # The layer is read-only for the service user: files 0444 and directories 0555, owned by root.
    entry = f"{result['baked_cache_dir']}/entries/{plan['cache_key']}"
    container = client.containers.create(result["image"], command=["x"])
    try:
        stream, _ = container.get_archive(entry)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            members = tar.getmembers()
    finally:
        container.remove(force=True)
    assert members and all(m.uid == 0 and m.mode & 0o022 == 0 for m in members)   # root's, nobody else writes
    assert all(m.mode & 0o222 == 0 for m in members if m.name != plan["cache_key"])


def test_bake_from_a_named_volume_and_from_a_tarball_of_one_entry(client, base, plan, made, tmp_path):
    entry = seed_entry(plan, tmp_path / "seeds")
    volume = f"turingbox-bake-test-{uuid.uuid4().hex[:8]}"
    client.volumes.create(volume)
    made["volumes"].append(volume)
    # Fill the volume as `make warmup-cache` leaves it: <volume>/entries/<key>/...
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(tmp_path / "seeds"), arcname="cache")
    filler = client.containers.create(base, command=["x"], volumes={volume: {"bind": "/cache", "mode": "rw"}})
    try:
        filler.put_archive("/", buf.getvalue())
    finally:
        filler.remove(force=True)
    tag = f"turingbox-bake-test:vol-{uuid.uuid4().hex[:6]}"
    made["images"].append(tag)
    r = run_bake("--image", base, "--from-volume", volume, "--tag", tag, env={"TURINGBOX_GPUS_JSON": H200})
    assert r.returncode == 0, r.stderr
    assert tag in r.stdout and plan["cache_key"] in r.stdout
    check_derived(client, tag, plan)

    tgz = tmp_path / "entry.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(entry, arcname=plan["cache_key"])
    tag2 = f"turingbox-bake-test:tgz-{uuid.uuid4().hex[:6]}"
    made["images"].append(tag2)
    r = run_bake("--image", base, "--from-dir", str(tgz), "--gpus-json", H200, "--tag", tag2)
    assert r.returncode == 0, r.stderr
    assert client.images.get(tag2).labels["org.turingbox.cache.key"] == plan["cache_key"]


@pytest.mark.parametrize("case", ["incomplete", "other-gpus", "missing-volume"])
def test_bake_refuses_with_one_sentence_and_builds_nothing(client, base, plan, made, tmp_path, case):
    tag = f"turingbox-bake-test:refused-{uuid.uuid4().hex[:6]}"
    made["images"].append(tag)
    if case == "incomplete":
        seed_entry(plan, tmp_path / "seeds", complete=False)
        args = ["--from-dir", str(tmp_path / "seeds"), "--gpus-json", H200]
        expected = f"bake: Cache entry {plan['cache_key']} in {tmp_path / 'seeds'} is incomplete"
    elif case == "other-gpus":
        seed_entry(plan, tmp_path / "seeds")      # seeded for one H200, baked for two
        args = ["--from-dir", str(tmp_path / "seeds"), "--gpus-json", TWO_H200]
        expected = f"bake: Cache entry {plan['cache_key']} in {tmp_path / 'seeds'} was made for a different plan"
    else:
        args = ["--from-volume", "turingbox-no-such-volume", "--gpus-json", H200]
        expected = "bake: There is no Docker volume named turingbox-no-such-volume."
    r = run_bake("--image", base, "--tag", tag, *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), r.stderr
    if case == "other-gpus":
        assert "plan.tensor_parallel_size: 1 != 2" in lines[0]
    assert "Traceback" not in r.stderr
    with pytest.raises(Exception):
        client.images.get(tag)
