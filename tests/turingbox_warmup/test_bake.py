"""`make bake` decisions without Docker: which entry, refusals, tags, labels, sources, the build context."""
import io
import json
import os
import tarfile

import pytest

from turingbox_warmup import bake
from turingbox.cache import store
from tests.support.cache_helpers import make_plan
from tests.turingbox.cache.test_session import seed
from tests.support.plan_factory import cache_settings


def manifests(root):
    return store.list_entries(str(root))


def test_the_plans_own_entry_is_chosen_among_several(tmp_path):
    plan, other = make_plan(), make_plan(num_speculative_tokens=4)
    seed(plan, tmp_path)
    seed(other, tmp_path)
    assert bake.choose_key(plan, manifests(tmp_path), "dir", "img") == plan["cache_key"]
    assert bake.choose_key(plan, manifests(tmp_path), "dir", "img", key=plan["cache_key"]) == plan["cache_key"]


def test_an_entry_for_another_plan_is_refused_naming_the_inputs_that_differ(tmp_path):
    seed(make_plan(num_speculative_tokens=4), tmp_path)
    plan = make_plan()
    with pytest.raises(bake.BakeRefused) as exc:
        bake.choose_key(plan, manifests(tmp_path), "/seeds", "turingbox:0.1.0")
    msg = str(exc.value)
    assert msg.count(".") >= 1 and "\n" not in msg
    assert "was made for a different plan than turingbox:0.1.0 makes for the stated GPUs" in msg
    assert f"(key {plan['cache_key']})" in msg and "plan.num_speculative_tokens: 4 != 3" in msg
    # An explicit --key that exists but is for another plan: refused the same way.
    other = make_plan(num_speculative_tokens=4)["cache_key"]
    with pytest.raises(bake.BakeRefused, match="plan.num_speculative_tokens: 4 != 3"):
        bake.choose_key(plan, manifests(tmp_path), "/seeds", "img", key=other)
    with pytest.raises(bake.BakeRefused, match="There is no cache entry 0000000000000000 in /seeds .it holds 1 entry"):
        bake.choose_key(plan, manifests(tmp_path), "/seeds", "img", key="0" * 16)


def test_an_empty_source_is_refused(tmp_path):
    with pytest.raises(bake.BakeRefused, match="has no cache entry for the plan img makes .* it holds no entries"):
        bake.choose_key(make_plan(), {}, "volume v", "img")


def test_incomplete_and_corrupt_entries_are_refused_in_one_sentence(tmp_path):
    plan = make_plan()
    s = store.prepare_cache(plan, cache_settings(str(tmp_path)))
    s.finish(False)
    msg = bake.entry_refusal(s.entry, plan["cache_key"], "d")
    assert msg.startswith(f"Cache entry {plan['cache_key']} in d is incomplete") and "warmup --seed-only" in msg
    seed(plan, tmp_path)
    assert bake.entry_refusal(s.entry, plan["cache_key"], "d") is None
    open(os.path.join(s.entry, "triton", "abc", "__grp__kernel.json"), "w").write("{")
    assert "is corrupt (triton/abc/__grp__kernel.json is not valid JSON)" in bake.entry_refusal(s.entry, plan["cache_key"], "d")


@pytest.mark.parametrize("ref, tag", [
    ("turingbox:0.1.0", "turingbox:0.1.0-K"),
    ("registry.local:5000/team/turingbox:0.2.0", "registry.local:5000/team/turingbox:0.2.0-K"),
    ("registry.local:5000/turingbox", "registry.local:5000/turingbox:9.9-K"),
    ("sha256:" + "ab" * 32, "turingbox:9.9-K"),
    ("turingbox:0.1.0@sha256:" + "ab" * 32, "turingbox:0.1.0-K"),
])
def test_derived_tag(ref, tag):
    assert bake.derived_tag(ref, "K", "9.9") == tag


def test_labels_carry_every_fingerprint_input():
    plan = make_plan()
    m = {"key": plan["cache_key"], "inputs": plan["cache_inputs"], "completed": "t"}
    labels = bake.labels_for(m, "turingbox:0.1.0", "/seeds")
    assert labels["org.turingbox.cache.key"] == plan["cache_key"]
    assert json.loads(labels["org.turingbox.cache.inputs"]) == plan["cache_inputs"]
    assert labels["org.turingbox.cache.inputs.plan.num_speculative_tokens"] == "3"
    assert labels["org.turingbox.cache.inputs.gpu_name"] == "NVIDIA GeForce RTX 2080 Ti"
    assert labels["org.turingbox.cache.inputs.software.vllm"] == "0.21.0"
    assert labels["org.turingbox.cache.inputs.plan.cudagraph_capture_sizes"] == "[1, 2, 4, 8, 16]"


def test_baked_dir_follows_the_image_setting_or_is_set():
    assert bake.baked_dir_of({"Config": {"Env": ["PATH=/x", "TURINGBOX_BAKED_CACHE_DIR=/opt/aot"]}}) == ("/opt/aot", False)
    assert bake.baked_dir_of({"Config": {"Env": ["PATH=/x"]}}) == (bake.DEFAULT_BAKED_DIR, True)
    df = bake.dockerfile("sha256:abc", "/opt/b", "K", True)
    assert df.splitlines() == ["FROM sha256:abc", "COPY entry /opt/b/entries/K", "ENV TURINGBOX_BAKED_CACHE_DIR=/opt/b"]


def test_sources_a_root_an_entry_or_a_tarball_of_either(tmp_path):
    plan = make_plan()
    s = seed(plan, tmp_path / "root")
    key = plan["cache_key"]
    work = tmp_path / "work"
    work.mkdir()
    assert bake.stage_dir(str(tmp_path / "root"), str(work)) == str(tmp_path / "root")
    from_entry = bake.stage_dir(s.entry, str(work))
    assert not bake.entry_refusal(store.entry_dir(from_entry, key), key, "x")
    for arcname, path in (("root", tmp_path / "root"), (key, s.entry)):
        tgz = tmp_path / f"{arcname}.tar.gz"
        with tarfile.open(tgz, "w:gz") as tar:
            tar.add(path, arcname=arcname)
        root = bake.stage_dir(str(tgz), str(work / arcname))
        assert list(store.list_entries(root)) == [key]
        assert not bake.entry_refusal(store.entry_dir(root, key), key, "x")
    with pytest.raises(bake.BakeRefused, match="does not exist"):
        bake.stage_dir(str(tmp_path / "nope"), str(work))
    (tmp_path / "junk.tar").write_text("not a tarball")
    with pytest.raises(bake.BakeRefused, match="neither a directory nor a readable tarball"):
        bake.stage_dir(str(tmp_path / "junk.tar"), str(work))


def test_a_tarball_that_escapes_its_folder_is_refused(tmp_path):
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        info = tarfile.TarInfo("../../outside")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(bake.BakeRefused):
        bake.stage_dir(str(evil), str(tmp_path / "w"))
    assert not (tmp_path / "outside").exists()


def test_build_context_holds_exactly_the_entry_read_only_with_the_bake_recorded(tmp_path):
    plan = make_plan()
    s = seed(plan, tmp_path)
    m = {**store.read_manifest(s.entry), "baked": {"image": "i"}}
    ctx = bake.build_context(s.entry, plan["cache_key"], "FROM x\n", m)
    with tarfile.open(fileobj=ctx) as tar:
        members = {t.name: t for t in tar.getmembers()}
        assert set(members) == {"Dockerfile", "entry", "entry/manifest.json", "entry/index.json", "entry/triton",
                                "entry/triton/abc", "entry/triton/abc/kernel.cubin", "entry/triton/abc/__grp__kernel.json",
                                "entry/vllm", "entry/vllm/torch_compile_cache", "entry/vllm/torch_compile_cache/h",
                                "entry/vllm/torch_compile_cache/h/rank_0_0", "entry/vllm/torch_compile_cache/h/rank_0_0/backbone",
                                "entry/vllm/torch_compile_cache/h/rank_0_0/backbone/artifact", "entry/inductor",
                                "entry/flashinfer"}
        assert all(t.mode == (0o555 if t.isdir() else 0o444) for n, t in members.items() if n != "Dockerfile")
        assert json.load(tar.extractfile("entry/manifest.json"))["baked"] == {"image": "i"}
        assert tar.extractfile("entry/triton/abc/kernel.cubin").read() == b"\x7fELF" * 64


def test_a_copy_of_a_read_only_baked_entry_is_writable_by_its_owner(tmp_path):
    plan = make_plan()
    seed(plan, tmp_path / "baked")
    for dirpath, dirs, files in os.walk(tmp_path / "baked"):
        for n in files:
            os.chmod(os.path.join(dirpath, n), 0o444)
        for n in dirs:
            os.chmod(os.path.join(dirpath, n), 0o555)
    s = store.prepare_cache(plan, cache_settings(str(tmp_path / "vol"), baked_cache_dir=str(tmp_path / "baked")))
    assert s.status["source"] == "baked"
    for dirpath, dirs, files in os.walk(s.entry):
        for n in dirs + files:
            assert os.stat(os.path.join(dirpath, n)).st_mode & 0o200, n
    s.finish(True)
