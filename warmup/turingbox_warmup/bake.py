"""`make bake`: an image with one seeded cache entry inside, in a read-only layer.

    python -m turingbox_warmup.bake --image turingbox:0.1.0 (--from-volume NAME | --from-dir PATH)
                                    [--gpus-json FILE] [--key KEY] [--tag TAG]

Host side, Docker SDK only. Steps:
  1. ask the image itself for the plan it would make for the stated GPUs (`turingbox plan --json
     --gpus-json FILE` in a container without network, with the host's TURINGBOX_* settings, as
     compose passes them): the key must be computed by the image's software, not the host's;
  2. pick that plan's entry from the source — a named volume filled by `make warmup-cache`, or a
     directory (a cache root, or one entry) or tarball of either produced by `turingbox warmup
     --seed-only` on any GPU host;
  3. refuse, in one sentence, an entry that is missing, incomplete, corrupt, or made for another
     plan (naming the inputs that differ);
  4. build `<repository>:<version>-<cache_key>` FROM the image with exactly that entry at
     `<baked_cache_dir>/entries/<key>` (files 0444, directories 0555, owned by root), the setting
     TURINGBOX_BAKED_CACHE_DIR pointing there, and labels carrying the fingerprint inputs.

At start the runtime copies a matching baked entry into the cache volume (or a temporary
directory) and logs `cache hit ... from baked`; an entry for another plan is ignored with the
differing inputs in the log (turingbox.cache.store).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
from typing import Any, Mapping

from turingbox import __version__, config
from turingbox.cache import fingerprint, store
from turingbox.config import envs
from turingbox_warmup.image import flashinfer_aot

DEFAULT_BAKED_DIR = "/opt/turingbox/baked-cache"
BAKED_ENV = "TURINGBOX_BAKED_CACHE_DIR"
LABEL_PREFIX = "org.turingbox.cache."
CACHE_MOUNT = "/cache"
GPUS_IN_CONTAINER = "/tmp/turingbox-bake-gpus.json"


class BakeRefused(Exception):
    """Bad input or an entry that must not be baked: one sentence, exit 2."""

    exit_code = 2


class BakeFailed(Exception):
    """Docker could not do what was asked: one sentence, exit 1."""

    exit_code = 1


# ---- pure decisions -----------------------------------------------------------------------------

def derived_tag(image_ref: str, key: str, version: str) -> str:
    """`turingbox:0.1.0` -> `turingbox:0.1.0-<key>`; an untagged name or an image id uses `version`."""
    ref = image_ref.split("@", 1)[0]
    repo, tag = ref.rsplit(":", 1) if ":" in ref.rsplit("/", 1)[-1] else (ref, "")
    is_id = repo == "sha256" or (len(repo) >= 12 and all(c in "0123456789abcdef" for c in repo))
    if is_id:
        repo, tag = "turingbox", ""
    return f"{repo}:{tag or version}-{key}"


def flatten(inputs: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{"plan": {"tensor_parallel_size": 1}} -> {"plan.tensor_parallel_size": "1"} (JSON for non-scalars)."""
    out: dict[str, str] = {}
    for k in sorted(inputs):
        v = inputs[k]
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, name + "."))
        else:
            out[name] = v if isinstance(v, str) else json.dumps(v)
    return out


def labels_for(manifest: Mapping[str, Any], base_image: str, source: str) -> dict[str, str]:
    labels = {f"{LABEL_PREFIX}{k}": v for k, v in flatten(manifest["inputs"], "inputs.").items()}
    labels.update({
        f"{LABEL_PREFIX}key": manifest["key"],
        f"{LABEL_PREFIX}inputs": json.dumps(manifest["inputs"], sort_keys=True, separators=(",", ":")),
        f"{LABEL_PREFIX}completed": str(manifest.get("completed")),
        f"{LABEL_PREFIX}base-image": base_image,
        f"{LABEL_PREFIX}source": source,
    })
    return labels


def dockerfile(base_image_id: str, baked_dir: str, key: str, set_env: bool) -> str:
    lines = [f"FROM {base_image_id}",
             f"COPY entry {baked_dir}/entries/{key}"]
    if set_env:
        lines.append(f"ENV {BAKED_ENV}={baked_dir}")
    return "\n".join(lines) + "\n"


def choose_key(plan: Mapping[str, Any], manifests: Mapping[str, Mapping[str, Any] | None], source: str,
               image: str, key: str | None = None) -> str:
    """The entry to bake: the plan's own, or `key` if it matches the plan; else a one-sentence refusal."""
    wanted = plan.get("cache_key")
    inputs = plan.get("cache_inputs")
    if not isinstance(inputs, dict) or not wanted:
        raise BakeRefused(f"The plan {image} made has no cache_key/cache_inputs, so no entry can be matched to it.")
    if key is not None and key not in manifests:
        raise BakeRefused(f"There is no cache entry {key} in {source} ({_count(manifests)}).")
    if key is not None and key != wanted or key is None and wanted not in manifests:
        candidates = {k: m["inputs"] for k, m in manifests.items()
                      if (key is None or k == key) and m and isinstance(m.get("inputs"), dict)}
        near = store.nearest(inputs, candidates)
        if near is None:
            raise BakeRefused(f"{source} has no cache entry for the plan {image} makes for the stated GPUs "
                              f"(key {wanted}; {_count(manifests)}).")
        raise BakeRefused(f"Cache entry {near[0]} in {source} was made for a different plan than {image} makes "
                          f"for the stated GPUs (key {wanted}): " + "; ".join(near[1] or ["same inputs, other key"]) + ".")
    return wanted


def _count(manifests: Mapping[str, Any]) -> str:
    n = len(manifests)
    return "it holds no entries" if not n else f"it holds {n} entr{'y' if n == 1 else 'ies'}: " + ", ".join(sorted(manifests))


def entry_refusal(entry: str, key: str, source: str) -> str | None:
    problems = store.entry_problems(entry, key, deep=True)
    if not problems:
        return None
    if problems == [store.INCOMPLETE]:
        return (f"Cache entry {key} in {source} is incomplete (its manifest was never completed): finish seeding it "
                "with `turingbox warmup --seed-only` before baking it.")
    return f"Cache entry {key} in {source} is corrupt ({'; '.join(problems[:3])}); reseed it before baking it."


# ---- sources: a directory / tarball, or a named volume ------------------------------------------

def _safe_extract(tar: tarfile.TarFile, dest: str) -> None:
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    for member in tar.getmembers():  # older Pythons: refuse escaping paths and links ourselves
        target = os.path.realpath(os.path.join(dest, member.name))
        if not target.startswith(os.path.realpath(dest) + os.sep) or member.issym() or member.islnk() or member.isdev():
            raise BakeRefused(f"The archive member {member.name!r} would be written outside the cache entry.")
    tar.extractall(dest)


def find_root(path: str, work: str) -> str:
    """A cache root (has entries/) or a single entry (has manifest.json) -> a cache root."""
    if os.path.isdir(os.path.join(path, "entries")):
        return path
    if os.path.isfile(os.path.join(path, store.MANIFEST)):
        manifest = store.read_manifest(path) or {}
        key = manifest.get("key") if isinstance(manifest.get("key"), str) else os.path.basename(os.path.normpath(path))
        parent = tempfile.mkdtemp(prefix="root-", dir=work)
        os.makedirs(os.path.join(parent, "entries"))
        os.symlink(os.path.abspath(path), os.path.join(parent, "entries", key))
        return parent
    subdirs = [d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d))]
    if len(subdirs) == 1:       # a tarball's single top-level folder
        return find_root(os.path.join(path, subdirs[0]), work)
    raise BakeRefused(f"{path} is neither a cache root (with entries/) nor a cache entry (with manifest.json).")


def stage_dir(path: str, work: str) -> str:
    """--from-dir: a directory is used in place; a tarball is unpacked into work."""
    if not os.path.exists(path):
        raise BakeRefused(f"--from-dir {path} does not exist.")
    if os.path.isdir(path):
        return find_root(path, work)
    try:
        with tarfile.open(path) as tar:
            dest = os.path.join(work, "unpacked")
            os.makedirs(dest)
            _safe_extract(tar, dest)
    except (tarfile.TarError, OSError) as exc:
        raise BakeRefused(f"--from-dir {path} is neither a directory nor a readable tarball ({exc}).") from None
    return find_root(dest, work)


class VolumeSource:
    """A named cache volume, read through a created (never started) container of the image."""

    def __init__(self, client, image: str, volume: str) -> None:
        self.client, self.image, self.volume = client, image, volume
        try:
            client.volumes.get(volume)
        except Exception:
            raise BakeRefused(f"There is no Docker volume named {volume}.") from None

    def manifests(self) -> dict[str, dict | None]:
        out = run_in_image(self.client, self.image, ["cache", "show", "--json", "--cache-dir", CACHE_MOUNT],
                           volumes={self.volume: {"bind": CACHE_MOUNT, "mode": "ro"}},
                           what=f"listing the cache volume {self.volume}")
        rows = json.loads(out).get("entries", [])
        return {r["key"]: ({"key": r["key"], "inputs": r["inputs"]} if isinstance(r.get("inputs"), dict) else None)
                for r in rows}

    def fetch(self, key: str, work: str) -> str:
        container = self.client.containers.create(self.image, command=["true"], network_disabled=True,
                                                  volumes={self.volume: {"bind": CACHE_MOUNT, "mode": "ro"}})
        try:
            stream, _stat = container.get_archive(f"{CACHE_MOUNT}/entries/{key}")
            raw = io.BytesIO(b"".join(stream))
        finally:
            container.remove(force=True)
        dest = os.path.join(work, "volume", "entries")
        os.makedirs(dest)
        with tarfile.open(fileobj=raw) as tar:
            _safe_extract(tar, dest)
        return os.path.join(dest, key)


# ---- the image --------------------------------------------------------------------------------------

def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _tar_bytes(files: Mapping[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            _add_bytes(tar, name, data, 0o444)
    return buf.getvalue()


def run_in_image(client, image: str, args: list[str], *, what: str, environment: Mapping[str, str] | None = None,
                 files: Mapping[str, bytes] | None = None, volumes: Mapping | None = None) -> str:
    """`turingbox ARGS` in a throwaway container without network; stdout, or BakeFailed with its stderr."""
    container = client.containers.create(image, entrypoint=["turingbox"], command=args, network_disabled=True,
                                         environment=dict(environment or {}), volumes=dict(volumes or {}))
    try:
        if files:
            container.put_archive("/", _tar_bytes({k.lstrip("/"): v for k, v in files.items()}))
        container.start()
        code = int(container.wait(timeout=300).get("StatusCode", 1))
        out = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
        err = container.logs(stdout=False, stderr=True).decode("utf-8", "replace").strip()
    finally:
        container.remove(force=True)
    if code != 0:
        last = err.splitlines()[-1] if err else f"exit code {code}"
        raise BakeRefused(f"{what} in {image} failed: {last.removeprefix('turingbox: ')}")
    return out


def image_plan(client, image: str, gpus_json: str | None, environ: Mapping[str, str]) -> dict:
    """The plan the image makes for the stated GPUs (its own software versions, the host's settings)."""
    env = {k: v for k, v in environ.items() if k.startswith("TURINGBOX_") and k not in ("TURINGBOX_GPUS_JSON",)}
    files = {}
    args = ["plan", "--json"]
    if gpus_json:
        try:
            with open(gpus_json, "rb") as f:
                files[GPUS_IN_CONTAINER] = f.read()
        except OSError as exc:
            raise BakeRefused(f"--gpus-json {gpus_json} cannot be read ({exc.strerror or exc}).") from None
        args += ["--gpus-json", GPUS_IN_CONTAINER]
    out = run_in_image(client, image, args, environment=env, files=files,
                       what="Planning for the stated GPUs" if gpus_json else "Planning (no --gpus-json: NVML)")
    try:
        return json.loads(out)
    except ValueError:
        raise BakeFailed(f"`turingbox plan --json` in {image} did not print JSON.") from None


def baked_dir_of(image_attrs: Mapping[str, Any]) -> tuple[str, bool]:
    """(where the entry goes, whether the derived image must set TURINGBOX_BAKED_CACHE_DIR)."""
    for item in (image_attrs.get("Config") or {}).get("Env") or []:
        name, _, value = item.partition("=")
        if name == BAKED_ENV and value:
            return value, False
    return DEFAULT_BAKED_DIR, True


def build_context(entry: str, key: str, df: str, manifest: Mapping[str, Any]) -> io.BytesIO:
    """Dockerfile + entry/ with read-only modes and root ownership; the manifest records the bake."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _add_bytes(tar, "Dockerfile", df.encode(), 0o644)
        for dirpath, dirs, names in os.walk(entry, followlinks=True):
            dirs.sort()
            rel = os.path.relpath(dirpath, entry)
            arc = "entry" if rel == "." else f"entry/{rel}"
            info = tarfile.TarInfo(arc)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o555, 0
            tar.addfile(info)
            for name in sorted(names):
                path = os.path.join(dirpath, name)
                if rel == "." and name == store.MANIFEST:
                    _add_bytes(tar, f"{arc}/{name}", json.dumps(manifest, indent=2, sort_keys=True).encode(), 0o444)
                    continue
                ninja = flashinfer_aot.relocatable_ninja(dirpath) if name == "build.ninja" else None
                if ninja is not None:     # FlashInfer's names the seeding host's paths: ninja would rebuild
                    _add_bytes(tar, f"{arc}/{name}", ninja.encode(), 0o444)
                    continue
                if os.path.islink(path) and not os.path.exists(path):
                    continue
                info = tar.gettarinfo(path, f"{arc}/{name}")
                if not info.isfile():
                    continue
                info.mode, info.uid, info.gid, info.uname, info.gname = 0o444, 0, 0, "root", "root"
                with open(path, "rb") as f:
                    tar.addfile(info, f)
    buf.seek(0)
    return buf


def local_image(client, image: str):
    """The Docker image `image`, or a one-sentence refusal when it is not present here."""
    try:
        return client.images.get(image)
    except Exception:
        raise BakeRefused(f"The image {image} is not present here; build it with `make image`.") from None


def bake(client, image: str, source_desc: str, manifests: Mapping[str, Any], fetch, gpus_json: str | None,
         environ: Mapping[str, str], key: str | None = None, tag: str | None = None, work: str = "",
         log=print) -> dict[str, Any]:
    base = local_image(client, image)
    plan = image_plan(client, image, gpus_json, environ)
    chosen = choose_key(plan, manifests, source_desc, image, key)
    entry = fetch(chosen)
    refusal = entry_refusal(entry, chosen, source_desc)
    if refusal:
        raise BakeRefused(refusal)
    manifest = store.read_manifest(entry)
    if fingerprint.cache_key(manifest["inputs"]) != plan["cache_key"]:  # belt and braces: the key is the hash
        raise BakeRefused(f"Cache entry {chosen} in {source_desc} does not hash to the plan's key {plan['cache_key']}.")
    baked_dir, set_env = baked_dir_of(base.attrs)
    version = (base.labels or {}).get("org.opencontainers.image.version") or __version__
    name = tag or derived_tag(image, chosen, version)
    manifest = {**manifest, "hits": 0, "last_hit": None,
                "baked": {"image": image, "from": source_desc,
                          "at": store.utc_now()}}
    context = build_context(entry, chosen, dockerfile(base.id, baked_dir, chosen, set_env), manifest)
    log(f"bake: building {name} from {image} with cache entry {chosen} ({store.format_sizes(manifest.get('sizes') or {})})")
    try:
        built, _logs = client.images.build(fileobj=context, custom_context=True, tag=name, rm=True, forcerm=True,
                                           labels=labels_for(manifest, image, source_desc))
    except Exception as exc:
        raise BakeFailed(f"Building {name} failed: {exc}".rstrip(".") + ".") from None
    return {"image": name, "id": built.id, "cache_key": chosen, "baked_cache_dir": baked_dir,
            "entry": f"{baked_dir}/entries/{chosen}", "sizes": manifest.get("sizes") or {},
            "gpu_name": plan.get("gpu_name"), "tensor_parallel_size": plan.get("tensor_parallel_size"),
            "num_speculative_tokens": plan.get("num_speculative_tokens")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make bake", description=__doc__.splitlines()[0])
    p.add_argument("--image", required=True, help="the appliance image to derive from (turingbox:VERSION)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-volume", metavar="NAME", help="named cache volume filled by `make warmup-cache`")
    src.add_argument("--from-dir", metavar="PATH", help="cache root, cache entry, or a tarball of either")
    p.add_argument("--gpus-json", default=config.resolve(("gpus_json",))["gpus_json"],
                   help="the GPUs the baked image is for (inventory JSON; env TURINGBOX_GPUS_JSON); "
                        "default: this host's GPUs via NVML inside the image")
    p.add_argument("--key", help="bake this entry (it must still match the plan)")
    p.add_argument("--tag", help="name of the derived image (default REPO:VERSION-KEY)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    a = p.parse_args(argv)
    work = tempfile.mkdtemp(prefix="turingbox-bake-")
    try:
        try:
            import docker
            client = docker.from_env()
            client.ping()
        except Exception as exc:
            raise BakeRefused(f"Cannot reach the Docker engine ({exc.__class__.__name__}).") from None
        if a.from_dir:
            root = stage_dir(a.from_dir, work)
            manifests = store.list_entries(root)
            desc = a.from_dir

            def fetch(key: str) -> str:
                return store.entry_dir(root, key)
        else:
            volume = VolumeSource(client, a.image, a.from_volume)
            desc = f"volume {a.from_volume}"
            local_image(client, a.image)    # the volume is listed by a container of the image
            manifests = volume.manifests()

            def fetch(key: str) -> str:
                return volume.fetch(key, work)
        # environ: host tool: the host's TURINGBOX_* go raw into the planning container, which resolves them
        result = bake(client, a.image, desc, manifests, fetch, a.gpus_json, envs.process_environment(), a.key, a.tag, work,
                      log=lambda m: print(m, file=sys.stderr))
    except (BakeRefused, BakeFailed) as exc:
        print(f"bake: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # the Docker engine failing mid-way (timeouts, API errors): one line, exit 1
        print(f"bake: the Docker engine failed: {exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
              file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(f"{result['image']}: cache entry {result['cache_key']} at {result['entry']} "
              f"({result['gpu_name']}, TP {result['tensor_parallel_size']}, MTP {result['num_speculative_tokens']}; "
              f"{store.format_sizes(result['sizes'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
