"""One cache root, one entry per plan fingerprint, safe on shared volumes.

Layout (see docs/caches.md):

    <root>/entries/<cache_key>/manifest.json   fingerprint inputs, created/completed, sizes, hits, tools, and the
                                               KV cache sizes starts measured (kv_cache, per engine signature)
    <root>/entries/<cache_key>/vllm/            VLLM_CACHE_ROOT (torch.compile artifacts, AOT graphs)
    <root>/entries/<cache_key>/triton/          TRITON_CACHE_DIR (kernels + *.autotune.json)
    <root>/entries/<cache_key>/inductor/        TORCHINDUCTOR_CACHE_DIR
    <root>/entries/<cache_key>/flashinfer/      FLASHINFER_WORKSPACE_BASE (.cache/flashinfer/<ver>/<arch>/cached_ops)
    <root>/entries/<cache_key>/index.json       every file's size when the entry was completed
    <root>/locks/<cache_key>.lock               writer lock (flock: released by the kernel if the holder dies)
    <root>/quarantine/<cache_key>-<timestamp>/  corrupt or repeatedly-failing entries, kept for inspection

`prepare_cache` makes every decision from what it finds on disk and returns a CacheSession whose
`.env` points vLLM, Triton, Inductor and FlashInfer at one directory. It never raises for a cache
problem: a corrupt entry is quarantined and rebuilt, a busy entry is used through a private copy,
an unusable volume falls back to a temporary directory. Serve always starts.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import filelock

from turingbox import __version__
from turingbox.cache.flashinfer_prebuilt import seed_workspace
from turingbox.config import CacheSettings
from turingbox.errors import UsageError
from turingbox.plan import fingerprint
from turingbox.plan.types import Plan

log = logging.getLogger("turingbox.cache")

FORMAT = 1
MANIFEST = "manifest.json"
INDEX = "index.json"
# cache name -> (sub-directory of the entry, environment variable that points the tool at it)
CACHES: dict[str, tuple[str, str]] = {
    "vllm": ("vllm", "VLLM_CACHE_ROOT"),
    "triton": ("triton", "TRITON_CACHE_DIR"),
    "inductor": ("inductor", "TORCHINDUCTOR_CACHE_DIR"),
    "flashinfer": ("flashinfer", "FLASHINFER_WORKSPACE_BASE"),
}
# An entry that failed to complete this many times is quarantined instead of reused: its partial
# contents may be what makes the engine fail, and reusing them forever would be a crash loop.
MAX_INCOMPLETE_ATTEMPTS = 2
# Below this much free space on the volume a seed would fail half-way; run cold instead.
MIN_FREE_BYTES = 1 << 30
# KV sizes kept per entry (one per engine signature; the oldest go first)
KV_SIZE_RECORDS = 8
# entry_problems' verdict on an interrupted seed: a normal miss, not corruption (verify and bake tell them apart).
INCOMPLETE = "entry is incomplete (its manifest was never completed)"
# ... and on an entry completed by a start that never reached a real engine (a stand-in, before issue 34 part 4
# kept such starts from completing it): nothing in it to hit, so also a miss, never corruption.
NO_ARTEFACTS = "entry holds no compile artefacts (the start that completed it never reached a real engine)"

# cache_dir, baked_cache_dir, cache_lock_wait, aot_triton_dir, aot_flashinfer_dir, aot_modelinfos_dir: declared in
# turingbox.config, handed in typed (CacheSettings)


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- pure helpers -------------------------------------------------------------------------

def entry_dir(root: str, key: str) -> str:
    return os.path.join(root, "entries", key)


def cache_env(entry: str) -> dict[str, str]:
    """Environment for the vLLM process: every cache inside `entry`."""
    env = {var: os.path.join(entry, sub) for sub, var in CACHES.values()}
    # TRITON_CACHE_AUTOTUNING=1 (autotune results next to the kernels in TRITON_CACHE_DIR) is in the plan's
    # env, the one environment the launcher hands vLLM with these paths.
    # vLLM's legacy InductorAdaptor (VLLM_USE_STANDALONE_COMPILE=0) rewrites TRITON_CACHE_DIR to a
    # rank folder under VLLM_CACHE_ROOT when compiling starts, hiding the seeded/baked Triton cache
    # from kernels launched afterwards. The standalone adaptor (0.21's default) leaves it alone.
    env["VLLM_USE_STANDALONE_COMPILE"] = "1"
    return env


def new_manifest(key: str, inputs: Mapping[str, Any], source: str) -> dict[str, Any]:
    now = utc_now()
    return {
        "format": FORMAT, "key": key, "inputs": dict(inputs), "created": now, "completed": None,
        "attempts": 1, "last_attempt": now, "hits": 0, "last_hit": None, "source": source,
        "sizes": {}, "tools": tool_versions(),
    }


def tool_versions() -> dict[str, str]:
    out = dict(fingerprint.software_versions())
    out["turingbox"] = __version__
    return out


def manifest_problem(manifest: Any, key: str) -> str | None:
    """Why a parsed manifest cannot describe entry `key`, or None if it is sound."""
    if not isinstance(manifest, dict):
        return "manifest is not a JSON object"
    for name, kind in (("format", int), ("key", str), ("inputs", dict), ("created", str), ("attempts", int)):
        if not isinstance(manifest.get(name), kind):
            return f"manifest field {name!r} is missing or has the wrong type"
    if manifest["format"] != FORMAT:
        return f"manifest format {manifest['format']} is not {FORMAT}"
    if manifest["key"] != key:
        return f"manifest key {manifest['key']} does not match its directory {key}"
    if fingerprint.cache_key(manifest["inputs"]) != key:
        return "manifest inputs do not hash to the entry's key"
    return None


def nearest(inputs: Mapping[str, Any], candidates: Mapping[str, Mapping[str, Any]]) -> tuple[str, list[str]] | None:
    """(key, differences) of the candidate whose fingerprint inputs differ from `inputs` least."""
    best = None
    for key in sorted(candidates):
        diff = fingerprint.differences(candidates[key], inputs)
        if best is None or len(diff) < len(best[1]):
            best = (key, diff)
    return best


# ---- small filesystem helpers -------------------------------------------------------------

def read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json_atomic(path: str, data: Any) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def walk_files(top: str):
    """(relative path, size) of every regular file under top."""
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            yield os.path.relpath(path, top), st.st_size


def measure(entry: str) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Per-cache {files, bytes} and the file index (relative path -> size) of an entry."""
    sizes: dict[str, dict[str, int]] = {}
    index: dict[str, int] = {}
    for name, (sub, _var) in CACHES.items():
        files = total = 0
        for rel, size in walk_files(os.path.join(entry, sub)):
            files += 1
            total += size
            index[os.path.join(sub, rel)] = size
        sizes[name] = {"files": files, "bytes": total}
    return sizes, index


def _stamps(entry: str):
    """(path relative to the entry, [size, mtime_ns]) of every file in the entry's caches, lazily."""
    for sub, _var in CACHES.values():
        for dirpath, _dirs, files in os.walk(os.path.join(entry, sub)):
            for name in files:
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                yield os.path.relpath(path, entry), [st.st_size, st.st_mtime_ns]


def cache_file_stamps(entry: str) -> dict[str, list[int]]:
    return dict(_stamps(entry))


def seeded_files(manifest: Mapping[str, Any] | None) -> dict[str, list[int]]:
    """The files turingbox itself put into the entry (AOT Triton kernels, vLLM model infos, prebuilt FlashInfer
    modules), as [size, mtime_ns] when seeded: manifest "seeded_files". Not the engine's work."""
    files = (manifest or {}).get("seeded_files")
    return {k: v for k, v in files.items() if isinstance(v, list)} if isinstance(files, dict) else {}


def has_engine_artefacts(entry: str, manifest: Mapping[str, Any] | None = None) -> bool:
    """Whether an engine wrote anything into the entry's caches: a file that turingbox did not seed (or a seeded
    one rewritten since) and that is not one of vLLM's model-info files (facts about model classes, no compile).
    A real vLLM start on a miss always writes some (torch.compile graphs, Triton kernels and autotune results,
    FlashInfer modules); the stand-in engine (tests/support/fake_vllm.py) and a start that died first write none."""
    manifest = read_manifest(entry) if manifest is None else manifest
    seeded = seeded_files(manifest)
    infos = os.path.join(CACHES["vllm"][0], MODELINFOS) + os.sep
    # the first such file answers: a hit entry's thousands of files are not all stat'ed again
    return any(seeded.get(path) != stamp and not path.startswith(infos) for path, stamp in _stamps(entry))


def entry_problems(entry: str, key: str, deep: bool = False) -> list[str]:
    """Everything wrong with a completed entry: manifest, indexed files, and (deep) JSON files.

    Files added after completion are fine (a later run may JIT something); files that vanished,
    were truncated to nothing, or JSON the runtime would choke on (Triton's group and autotune
    files) are not.
    """
    try:
        manifest = read_json(os.path.join(entry, MANIFEST))
    except FileNotFoundError:
        return ["manifest.json is missing"]
    except (OSError, ValueError) as exc:
        return [f"manifest.json is unreadable ({exc.__class__.__name__}: {exc})"]
    problem = manifest_problem(manifest, key)
    if problem:
        return [problem]
    if not manifest.get("completed"):
        return [INCOMPLETE]
    problems = []
    try:
        index = read_json(os.path.join(entry, INDEX))
        if not isinstance(index, dict):
            raise ValueError("index is not an object")
    except (OSError, ValueError) as exc:
        return [f"index.json is missing or unreadable ({exc.__class__.__name__})"]
    for rel, size in sorted(index.items()):
        path = os.path.join(entry, rel)
        try:
            actual = os.path.getsize(path)
        except OSError:
            problems.append(f"{rel} is missing")
            continue
        if size and not actual:
            problems.append(f"{rel} is empty (was {size} bytes)")
    if not problems and not has_engine_artefacts(entry, manifest):
        return [NO_ARTEFACTS]
    if deep:
        for rel, _size in walk_files(entry):
            if rel.endswith(".json") and rel not in (MANIFEST, INDEX):
                try:
                    read_json(os.path.join(entry, rel))
                except (OSError, ValueError):
                    problems.append(f"{rel} is not valid JSON")
    return problems


def read_manifest(entry: str) -> dict | None:
    try:
        m = read_json(os.path.join(entry, MANIFEST))
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) else None


def list_entries(root: str) -> dict[str, dict | None]:
    """key -> manifest (None when unreadable) for every entry under root."""
    base = os.path.join(root, "entries")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return {}
    return {n: read_manifest(os.path.join(base, n)) for n in names
            if not n.startswith(".") and os.path.isdir(os.path.join(base, n))}


def volume_problem(root: str, min_free_bytes: int) -> str | None:
    """Why the cache volume cannot take a writer (read-only, full, not a directory), or None."""
    try:
        for sub in ("entries", "locks", "quarantine"):
            os.makedirs(os.path.join(root, sub), exist_ok=True)
        probe = os.path.join(root, "locks", f".probe-{os.getpid()}")
        with open(probe, "wb") as f:
            f.write(b"x" * 4096)
            f.flush()
            os.fsync(f.fileno())
        os.unlink(probe)
    except OSError as exc:
        return f"cache root {root} is not writable ({exc.strerror or exc})"
    free = shutil.disk_usage(root).free
    if free < min_free_bytes:
        return f"cache root {root} has {free / 2**20:.0f} MiB free, below the {min_free_bytes / 2**20:.0f} MiB a seed needs"
    return None


def copy_entry(src: str, dst: str) -> None:
    """Copy an entry so that dst appears complete or not at all (staging dir + rename)."""
    parent = os.path.dirname(dst)
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, f".staging-{os.path.basename(dst)}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(src, staging, symlinks=True)
    make_owner_writable(staging)
    if os.path.exists(dst):
        _swap(staging, dst)
    else:
        os.replace(staging, dst)


def seed_aot_kernels(aot_dir: str, triton_dir: str) -> int:
    """Copy AOT-compiled Triton cache folders that the entry lacks; returns the number of files copied.

    Triton's cache folders are content-addressed (hash of source, specialization, target, options),
    so a folder of the same name is the same kernel: never overwritten, never mixed."""
    copied = 0
    try:
        names = sorted(os.listdir(aot_dir))
    except OSError as exc:
        log.warning("ahead-of-time Triton cache %s unreadable: %s", aot_dir, exc)
        return 0
    for name in names:
        src, dst = os.path.join(aot_dir, name), os.path.join(triton_dir, name)
        if not os.path.isdir(src) or os.path.exists(dst):
            continue
        tmp = f"{dst}.tmp-{os.getpid()}"
        try:
            shutil.copytree(src, tmp)
            make_owner_writable(tmp)
            os.replace(tmp, dst)
            copied += sum(1 for _ in walk_files(dst))
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            log.warning("could not copy ahead-of-time kernel %s: %s", src, exc)
    return copied


MODELINFOS = "modelinfos"     # vLLM's model-class facts under VLLM_CACHE_ROOT (turingbox_warmup.image.modelinfos)


def modelinfo_sources(aot_dir: str | None, roots: list[str | None], key: str, inputs: Mapping[str, Any]) -> list[str]:
    """Where a new entry can find vLLM's modelinfo files, best first: the image's (aot_modelinfos_dir), then
    every other completed entry made with the same vLLM, on the volume and in the baked layer. The files describe
    vLLM's model classes, not the plan, so such an entry's are as good as the image's."""
    dirs = [os.path.join(aot_dir, MODELINFOS)] if aot_dir else []
    vllm = (inputs.get("software") or {}).get("vllm")
    for root in roots:
        if not root:
            continue
        for other, manifest in list_entries(root).items():
            if other == key or not manifest or manifest_problem(manifest, other) or not manifest.get("completed"):
                continue   # an interrupted or broken entry may hold a half-written file
            if (manifest["inputs"].get("software") or {}).get("vllm") != vllm:
                continue   # another vLLM's files would only be ignored by vLLM (their hash differs)
            dirs.append(os.path.join(entry_dir(root, other), CACHES["vllm"][0], MODELINFOS))
    return [d for d in dirs if os.path.isdir(d)]


def _modelinfo(path: str) -> dict | None:
    """A modelinfo file as vLLM 0.21 writes it ({"hash": str, "modelinfo": {...}}), else None."""
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and isinstance(data.get("hash"), str) and isinstance(data.get("modelinfo"), dict)
    return data if ok else None


def seed_modelinfos(sources: list[str], vllm_dir: str) -> dict[str, int]:
    """Copy the well-formed vLLM modelinfo files that `vllm_dir`/modelinfos lacks, the first source having a
    name winning; returns {source: files copied} for the sources that gave any.

    vLLM names a file after the model class and checks the hash of the class's source file stored in it, so a
    file from another vLLM is ignored (and rewritten) by vLLM, never used. A malformed one would stay, for a class
    vLLM never loads, and make the entry fail `cache verify`: those are skipped. Without the files vLLM imports
    each architecture in a fresh interpreter before it starts its engine (44-66 s on the H200 for Qwen3.6 and its
    MTP drafter, docs/startup.md)."""
    dst_dir = os.path.join(vllm_dir, MODELINFOS)
    copied: dict[str, int] = {}
    for src_dir in sources:
        try:
            names = sorted(n for n in os.listdir(src_dir) if n.endswith(".json"))
        except OSError as exc:
            log.warning("model-info directory %s unreadable: %s", src_dir, exc)
            continue
        for name in names:
            dst = os.path.join(dst_dir, name)
            data = None if os.path.exists(dst) else _modelinfo(os.path.join(src_dir, name))
            if data is None:
                continue
            try:
                os.makedirs(dst_dir, exist_ok=True)
                write_json_atomic(dst, data)
                copied[src_dir] = copied.get(src_dir, 0) + 1
            except OSError as exc:
                log.warning("could not copy model info %s: %s", os.path.join(src_dir, name), exc)
    return copied


def make_owner_writable(top: str) -> None:
    """A copy of a baked (read-only, 0444/0555) entry must take the engine's new files."""
    for dirpath, dirs, files in os.walk(top):
        for name in [*dirs, *files]:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o200)
    os.chmod(top, os.stat(top).st_mode | 0o200)


def _swap(staging: str, dst: str) -> None:
    old = f"{dst}.old-{os.getpid()}"
    os.replace(dst, old)
    os.replace(staging, dst)
    shutil.rmtree(old, ignore_errors=True)


# ---- the session ---------------------------------------------------------------------------

@dataclass
class CacheSession:
    """What serve/warmup use: `.env` for the vLLM process, `.status` for logs and metrics.

    `finish(ok)` completes the manifest (ok=True, and only when the engine wrote compile artefacts into the
    entry: a start on a stand-in engine must not leave a "complete" empty entry that later starts count as a
    hit) and releases the writer lock; call it once the engine is warm (strict warmup passed) or has failed.
    `status["completed"]` says whether it completed. It is idempotent and never raises.
    `close()` ends the session when the process exits, after the engine has stopped: it finishes an
    unfinished session as failed and deletes the temporary copy of private/cold modes, so restarts
    do not pile copies up in TMPDIR. The shared volume is never deleted.
    """

    key: str
    entry: str                          # the directory the engine uses
    env: dict[str, str]
    status: dict[str, Any]
    root: str | None = None             # the shared cache root (None when it is unusable)
    temp_dir: str | None = None         # the mkdtemp directory holding a private/cold entry; close() removes it
    _lock: filelock.BaseFileLock | None = field(default=None, repr=False)
    _finished: bool = field(default=False, repr=False)
    # finish() may run in a thread (serve completes the entry off its event loop) while close() runs at exit.
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def mode(self) -> str:
        return self.status["mode"]

    def finish(self, ok: bool) -> dict[str, Any]:
        with self._guard:
            if self._finished:
                return self.status
            self._finished = True
            completed = bool(ok)
            try:
                if self.mode == "shared":
                    completed = self._finish_shared(ok)
                elif self.mode == "private" and ok and self.root:
                    # only engine work is worth publishing to the volume (see has_engine_artefacts)
                    completed = has_engine_artefacts(self.entry)
                    if completed:
                        self._publish_private()
                    else:
                        _event(self.status, logging.WARNING, no_artefacts_sentence(self.key))
            except OSError as exc:  # a full or vanished volume must not take serve down
                completed = False
                _event(self.status, logging.WARNING, f"cache entry {self.key} could not be completed: {exc}")
            finally:
                if self._lock is not None:
                    self._lock.release()
                    self._lock = None
            self.status["completed"] = completed
            return self.status

    def kv_size(self, signature: str) -> int | None:
        """The KV cache size an earlier start with this engine signature (launch.engine_signature) recorded in the
        entry (record_kv_size); else None. Never raises."""
        kv = (read_manifest(self.entry) or {}).get("kv_cache")
        record = kv.get(signature) if isinstance(kv, dict) else None
        nbytes = record.get("bytes") if isinstance(record, dict) else None
        return nbytes if isinstance(nbytes, int) and not isinstance(nbytes, bool) and nbytes > 0 else None

    def record_kv_size(self, nbytes: int, signature: str) -> bool:
        """Record the KV cache size a start profiled in the entry's manifest ("kv_cache", one record per engine
        signature: starts with other `--` args or environments share an entry), so the next start of the same
        signature can skip vLLM's memory profile. Only while the session holds the entry (before finish: the writer
        lock is this session's until then). Never raises; whether it was written."""
        def record(kv: dict) -> None:
            kv[signature] = {"bytes": int(nbytes), "recorded": utc_now()}
            for old in sorted(kv, key=lambda k: str(kv[k].get("recorded")))[:-KV_SIZE_RECORDS]:
                del kv[old]
        if not self._edit_kv_sizes(record, "record the KV cache size"):
            return False
        _event(self.status, logging.INFO, f"cache entry {self.key}: recorded the KV cache size vLLM profiled, "
               f"{nbytes / 2**30:.2f} GiB, for the next start of this plan")
        return True

    def forget_kv_size(self, signature: str) -> bool:
        """Drop the record of this signature: a start given that size failed, so the next one profiles again rather
        than fail the same way at every restart (a driver or environment the signature does not see)."""
        if not self._edit_kv_sizes(lambda kv: kv.pop(signature, None), "drop the KV cache size"):
            return False
        _event(self.status, logging.WARNING, f"cache entry {self.key}: dropped the recorded KV cache size after a "
               "start given it failed; the next start profiles memory again")
        return True

    def _edit_kv_sizes(self, edit: Callable[[dict], Any], what: str) -> bool:
        with self._guard:
            if self._finished:
                return False
            try:
                manifest = read_manifest(self.entry)
                if manifest is None:
                    return False
                kv = manifest.get("kv_cache")
                kv = {k: v for k, v in kv.items() if isinstance(v, dict)} if isinstance(kv, dict) else {}
                edit(kv)
                manifest["kv_cache"] = kv
                write_json_atomic(os.path.join(self.entry, MANIFEST), manifest)
            except OSError as exc:
                _event(self.status, logging.WARNING, f"cache entry {self.key}: could not {what}: {exc}")
                return False
        return True

    def close(self, wait: bool = True) -> None:
        """finish(False) unless already finished (waiting for a finish still publishing), then delete
        the temporary directory. wait=False (exiting at once) skips both waiting and finishing.
        Idempotent, never raises."""
        if wait:
            self.finish(False)
        temp, self.temp_dir = self.temp_dir, None
        if temp:
            shutil.rmtree(temp, ignore_errors=True)

    def _finish_shared(self, ok: bool) -> bool:
        manifest = read_manifest(self.entry) or {}
        if not ok:
            _event(self.status, logging.WARNING,
                   f"cache entry {self.key} left incomplete after a failed start (attempt {manifest.get('attempts')})")
            return False
        if not has_engine_artefacts(self.entry, manifest):
            _event(self.status, logging.WARNING, no_artefacts_sentence(self.key))
            return False
        sizes, index = measure(self.entry)
        write_json_atomic(os.path.join(self.entry, INDEX), index)
        manifest["sizes"] = sizes
        manifest["completed"] = manifest.get("completed") or utc_now()
        manifest["tools"] = tool_versions()
        write_json_atomic(os.path.join(self.entry, MANIFEST), manifest)
        self.status["sizes"] = sizes
        _event(self.status, logging.INFO, f"cache entry {self.key} complete: " + format_sizes(sizes))
        return True

    def _publish_private(self) -> None:
        """A private run that warmed itself offers its result to the shared volume, if still wanted."""
        shared = entry_dir(self.root, self.key)
        lock = filelock.FileLock(os.path.join(self.root, "locks", f"{self.key}.lock"))
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            return
        try:
            if not entry_problems(shared, self.key):
                return  # someone else completed it meanwhile
            manifest = read_manifest(self.entry) or new_manifest(self.key, self.status["inputs"], "private")
            sizes, index = measure(self.entry)
            manifest.update(sizes=sizes, completed=manifest.get("completed") or utc_now(), tools=tool_versions())
            write_json_atomic(os.path.join(self.entry, INDEX), index)
            write_json_atomic(os.path.join(self.entry, MANIFEST), manifest)
            copy_entry(self.entry, shared)
            _event(self.status, logging.INFO, f"published privately warmed cache entry {self.key} to {shared}")
        finally:
            lock.release()


def no_artefacts_sentence(key: str) -> str:
    return (f"cache entry {key} left incomplete: the engine wrote no compile artefacts into it (a stand-in engine, "
            "not vLLM?), so no later start may count it as a hit")


def format_sizes(sizes: Mapping[str, Mapping[str, int]]) -> str:
    return ", ".join(f"{name} {s.get('files', 0)} files {s.get('bytes', 0) / 2**20:.1f} MiB"
                     for name, s in sizes.items())


def _event(status: dict, level: int, message: str) -> None:
    status.setdefault("events", []).append(message)
    log.log(level, message)


def _quarantine(root: str, key: str, entry: str, reason: str, status: dict) -> None:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    target = os.path.join(root, "quarantine", f"{key}-{stamp}")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.replace(entry, target)
    try:
        with open(os.path.join(target, "QUARANTINED.txt"), "w", encoding="utf-8") as f:
            f.write(reason + "\n")
    except OSError:
        pass
    status["quarantined"] = target
    _event(status, logging.WARNING, f"cache entry {key} quarantined to {target}: {reason}; rebuilding it")


def _per_cache(entry: str, hit: bool) -> dict[str, str]:
    """hit / empty (present but this plan never filled it) / miss, per cache."""
    out = {}
    for name, (sub, _var) in CACHES.items():
        if not hit:
            out[name] = "miss"
        else:
            has_files = next(iter(walk_files(os.path.join(entry, sub))), None) is not None
            out[name] = "hit" if has_files else "empty"
    return out


def _matching_source(root: str | None, key: str, inputs: Mapping[str, Any], label: str,
                     status: dict) -> str | None:
    """The complete, sound entry for `key` under a read-only root (baked layer), else None + reason."""
    if not root:
        return None
    entry = entry_dir(root, key)
    if os.path.isdir(entry):
        problems = entry_problems(entry, key)
        if not problems:
            return entry
        _event(status, logging.WARNING, f"{label} entry {key} in {root} ignored: {problems[0]}")
        return None
    others = {k: m["inputs"] for k, m in list_entries(root).items() if m and isinstance(m.get("inputs"), dict)}
    near = nearest(inputs, others)
    if near:
        _event(status, logging.INFO, f"{label} entry {near[0]} in {root} ignored: it was made for a different plan "
               f"({'; '.join(near[1]) or 'same inputs, different key'})")
    return None


def _log_miss(status: dict, root: str, key: str, inputs: Mapping[str, Any]) -> None:
    others = {k: m["inputs"] for k, m in list_entries(root).items()
              if k != key and m and m.get("completed") and isinstance(m.get("inputs"), dict)}
    near = nearest(inputs, others)
    if near:
        status["nearest"] = {"key": near[0], "differences": near[1]}
        _event(status, logging.INFO, f"cache miss for {key}; nearest entry {near[0]} differs in: " + "; ".join(near[1]))
    else:
        _event(status, logging.INFO, f"cache miss for {key}; no other entry in {root}")


def _private_copy(key: str, sources: list[str | None], inputs: Mapping[str, Any], prefix: str) -> tuple[str, str | None]:
    """A temporary entry, seeded from the first usable source; (dir, source used)."""
    tmp = tempfile.mkdtemp(prefix=f"turingbox-{prefix}-{key}-")
    entry = os.path.join(tmp, key)
    try:
        for src in sources:
            if not src:
                continue
            try:
                shutil.copytree(src, entry, symlinks=True)
                make_owner_writable(entry)
                return entry, src
            except OSError as exc:
                log.warning("could not copy cache entry %s: %s", src, exc)
                shutil.rmtree(entry, ignore_errors=True)
        os.makedirs(entry)
        write_json_atomic(os.path.join(entry, MANIFEST), new_manifest(key, inputs, prefix))
        return entry, None
    except BaseException:   # e.g. TMPDIR full: no session will own the directory, so remove it here
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def plan_fingerprint(plan: Plan | Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(key, inputs) of a Plan or of a plan's JSON object (`turingbox plan --json`, a baked image's label)."""
    inputs = plan.cache_inputs if isinstance(plan, Plan) else plan.get("cache_inputs")
    stated = plan.cache_key if isinstance(plan, Plan) else plan.get("cache_key")
    if not isinstance(inputs, Mapping):
        raise UsageError("The plan has no cache_inputs, so no cache entry can be chosen for it.")
    key = plan.compute_hash() if isinstance(plan, Plan) else fingerprint.cache_key(inputs)
    if stated not in (None, key):
        log.warning("plan cache_key %s does not match its cache_inputs (%s); using %s", stated, key, key)
    return key, dict(inputs)


def prepare_cache(plan: Plan | Mapping[str, Any], settings: CacheSettings, *, min_free_bytes: int = MIN_FREE_BYTES) -> CacheSession:
    """Choose (and if needed repair or create) the cache entry for `plan` under settings.cache_dir (consulting
    settings.baked_cache_dir, waiting settings.cache_lock_wait for another writer); see the module doc."""
    key, inputs = plan_fingerprint(plan)
    root = os.path.abspath(settings.cache_dir)
    baked = settings.baked_cache_dir
    wait = settings.cache_lock_wait
    status: dict[str, Any] = {"key": key, "root": root, "baked_root": baked, "inputs": dict(inputs),
                              "quarantined": None, "nearest": None, "events": []}
    baked_entry = _matching_source(baked, key, inputs, "baked", status)

    def session(mode: str, entry: str, result: str, source: str | None, lock=None, shared_root=None) -> CacheSession:
        # private/cold entries live in their own mkdtemp directory (see _private_copy), which the session owns
        temp_dir = os.path.dirname(entry) if mode != "shared" else None
        for sub, _var in CACHES.values():
            os.makedirs(os.path.join(entry, sub), exist_ok=True)
        before = cache_file_stamps(entry) if result == "miss" else {}
        if result == "miss" and settings.aot_triton_dir:
            added = seed_aot_kernels(settings.aot_triton_dir, os.path.join(entry, CACHES["triton"][0]))
            status["aot_kernels"] = added
            if added:
                _event(status, logging.INFO, f"cache entry {key}: {added} ahead-of-time Triton files from "
                       f"{settings.aot_triton_dir}")
        if result == "miss":
            sources = modelinfo_sources(settings.aot_modelinfos_dir, [shared_root or root, baked], key, inputs)
            copied = seed_modelinfos(sources, os.path.join(entry, CACHES["vllm"][0]))
            status["modelinfos"] = sum(copied.values())
            if copied:
                _event(status, logging.INFO, f"cache entry {key}: {status['modelinfos']} vLLM model-info files from "
                       f"{', '.join(copied)} (vLLM skips inspecting those model classes)")
        if result == "miss" and settings.aot_flashinfer_dir:
            modules = seed_workspace(settings.aot_flashinfer_dir, os.path.join(entry, CACHES["flashinfer"][0]))
            status["aot_flashinfer_modules"] = modules
            if modules:
                _event(status, logging.INFO, f"cache entry {key}: {modules} ahead-of-time FlashInfer modules from "
                       f"{settings.aot_flashinfer_dir}")
        if result == "miss":
            _record_seeded(entry, {p: st for p, st in cache_file_stamps(entry).items() if before.get(p) != st})
        status.update(mode=mode, entry=entry, result=result, source=source,
                      caches=_per_cache(entry, result == "hit"))
        verdict = ", ".join(f"{k} {v}" for k, v in status["caches"].items())
        _event(status, logging.INFO, f"cache {result} for {key} ({mode} entry {entry}"
               f"{', from ' + source if source else ''}): {verdict}")
        return CacheSession(key=key, entry=entry, env=cache_env(entry), status=status, root=shared_root,
                            temp_dir=temp_dir, _lock=lock)

    # 1. The volume must take a writer; otherwise run from a temporary directory.
    problem = volume_problem(root, min_free_bytes)
    if problem:
        _event(status, logging.WARNING, f"{problem}: running with a temporary cache (cold unless an entry can be copied)")
        shared = entry_dir(root, key)
        readable = shared if os.path.isdir(shared) and not entry_problems(shared, key) else None
        entry, src = _private_copy(key, [readable, baked_entry], inputs, "cold")
        return session("cold", entry, "hit" if src else "miss", src)

    # 2. One writer per entry.
    entry = entry_dir(root, key)
    lock = filelock.FileLock(os.path.join(root, "locks", f"{key}.lock"))
    try:
        lock.acquire(timeout=wait)
    except filelock.Timeout:
        complete = os.path.isdir(entry) and not entry_problems(entry, key)
        _event(status, logging.WARNING, f"cache entry {key} is being written by another process (waited {wait:g} s): "
               f"using a private copy{' of the complete entry' if complete else ''}")
        private, src = _private_copy(key, [entry if complete else None, baked_entry], inputs, "private")
        return session("private", private, "hit" if src else "miss", src, shared_root=root)
    try:
        return _prepare_locked(root, key, inputs, entry, baked_entry, status, lock, session)
    except OSError as exc:
        lock.release()
        _event(status, logging.WARNING, f"cache root {root} failed while preparing {key} ({exc}): running cold")
        private, src = _private_copy(key, [baked_entry], inputs, "cold")
        return session("cold", private, "hit" if src else "miss", src)


def _record_seeded(entry: str, added: Mapping[str, list[int]]) -> None:
    """Add what this session seeded to the manifest's seeded_files, so completion can tell it from engine work."""
    manifest = read_manifest(entry)
    if manifest is None or not added:
        return
    manifest["seeded_files"] = dict(sorted({**seeded_files(manifest), **added}.items()))
    write_json_atomic(os.path.join(entry, MANIFEST), manifest)


def _prepare_locked(root, key, inputs, entry, baked_entry, status, lock, session: Callable) -> CacheSession:
    if os.path.isdir(entry):
        manifest = read_manifest(entry)
        problems = entry_problems(entry, key)
        if not problems:
            manifest["hits"] = int(manifest.get("hits") or 0) + 1
            manifest["last_hit"] = utc_now()
            write_json_atomic(os.path.join(entry, MANIFEST), manifest)
            return session("shared", entry, "hit", "volume", lock, root)
        empty = problems == [NO_ARTEFACTS]
        incomplete = empty or (manifest is not None and manifest_problem(manifest, key) is None
                               and not manifest.get("completed"))
        if empty:
            _event(status, logging.INFO, f"cache entry {key} was completed by a start that wrote no compile artefacts "
                   "(a stand-in engine): treating it as a miss")
            manifest["completed"] = None
        # Partial contents may be what makes the engine fail, so repeated failures quarantine them; an entry
        # without engine artefacts holds nothing that could.
        resumable = incomplete and (manifest["attempts"] < MAX_INCOMPLETE_ATTEMPTS
                                    or not has_engine_artefacts(entry, manifest))
        if incomplete and resumable and not baked_entry:
            # An interrupted seed: its files are sound (every tool writes atomically); resume it.
            manifest["attempts"] += 1
            manifest["last_attempt"] = utc_now()
            write_json_atomic(os.path.join(entry, MANIFEST), manifest)
            _event(status, logging.INFO, f"cache entry {key} is incomplete (attempt {manifest['attempts']}): "
                   "treating it as a miss and continuing to fill it")
            _log_miss(status, root, key, inputs)
            return session("shared", entry, "miss", None, lock, root)
        if incomplete and baked_entry:
            shutil.rmtree(entry)
        else:
            reason = problems[0] if not incomplete else \
                f"incomplete after {manifest['attempts']} attempts; its partial contents may be what fails"
            _quarantine(root, key, entry, reason, status)
    if baked_entry:
        copy_entry(baked_entry, entry)
        manifest = read_manifest(entry)
        manifest.update(hits=int(manifest.get("hits") or 0) + 1, last_hit=utc_now(),
                        source=f"baked:{baked_entry}")
        write_json_atomic(os.path.join(entry, MANIFEST), manifest)
        return session("shared", entry, "hit", "baked", lock, root)
    _log_miss(status, root, key, inputs)
    os.makedirs(entry)
    write_json_atomic(os.path.join(entry, MANIFEST), new_manifest(key, inputs, "seeded"))
    return session("shared", entry, "miss", None, lock, root)
