"""Models by Hugging Face id: a hub id (`Qwen/Qwen3-0.6B`) resolved into a snapshot directory of the models volume.

Where: huggingface_hub's own cache layout under `<models_dir>/huggingface/hub` (the image sets HF_HOME to
/models/huggingface, so `hf download <id>` inside the container fills the same cache):
`models--<owner>--<name>/refs/<revision>` (the commit), `blobs/<etag>`, `snapshots/<commit>/<file>` (links to the
blobs). Beside huggingface_hub's folders, `turingbox/<commit>.json` keeps the hub's listing of that commit (path,
size, sha256 or git blob id of every file), so a start without network can tell a complete snapshot from a part.

Who fetches what:
- `turingbox plan` (`model_config(write=False)`) writes nothing: it reads config.json from the volume, or from the
  hub into memory, and its first plan reason says what serve would download.
- `turingbox serve` plans the same way with `write=True`: config.json, the listing and the ref go into the volume;
  then, in its `downloading` stage, `ensure_snapshot()` fetches the rest with progress (bytes, files, percent; a log
  line per 10 %). vLLM starts on the snapshot directory, so vLLM itself never downloads.

How: huggingface_hub reads HF_TOKEN, HF_ENDPOINT and HF_HUB_DOWNLOAD_TIMEOUT itself. Each missing file is fetched with
huggingface_hub's `http_get` (whose own retries resume with a Range request) into `blobs/<etag>.incomplete`, and an
interrupted download stays there: the next start resumes it. (huggingface_hub >= 1.31's `hf_hub_download` and
`snapshot_download` write each attempt to a fresh temporary name and delete it on failure, so a restart would begin
again at byte 0: fine for a tokenizer, not for 50 GB of weights behind a startup probe.) A finished blob is checked
against the listing (size; sha256 for LFS files, the git blob id for the others) before it is renamed into place, and
huggingface_hub's `hf_hub_download` then links it into the snapshot, so the layout is huggingface_hub's own. A file
lock per blob (huggingface_hub's own lock path) keeps two replicas on one shared volume from writing the same file.
Where the repo has safetensors weights, other weight formats (`*.bin`, `*.pth`, `*.gguf`, `original/`, ...) are not
fetched (vLLM loads the safetensors), as vLLM's own downloader does.

Offline (HF_HUB_OFFLINE=1) nothing is requested: the volume's snapshot is used when its listing says it is complete;
otherwise one sentence says what is missing and how to get it (UsageError, exit 2). A hub that cannot be reached with
a complete snapshot in the volume is the same as offline (a warning); without one, HubUnavailable (exit 1: a restart
may succeed).
"""
from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import urlparse

from turingbox import config as S
from turingbox.errors import UsageError

log = logging.getLogger("turingbox.hub")

HUB_SUBDIR = os.path.join("huggingface", "hub")     # under models_dir; the image's HF_HOME/hub
MANIFEST_DIR = "turingbox"                          # beside refs/, blobs/, snapshots/ in a repo's folder
DEFAULT_REVISION = "main"
CONFIG_FILE = "config.json"
COMMIT = re.compile(r"[0-9a-f]{40}")
WORKERS = 4                      # files fetched at once (shards of a large model are a few GB each)
PROGRESS_INTERVAL_S = 0.5        # how often the progress callback runs while bytes arrive
LOG_STEP_PERCENT = 10            # one log line per this many percent
_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's own truthy values
# Weight formats vLLM does not load when safetensors are there (vLLM's download_weights_from_hf picks one format).
OTHER_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.msgpack", "*.h5", "*.gguf", "*.onnx", "*.onnx_data",
                 "*.tflite", "*.ot", "*.mlmodel", "original/*")


class HubUnavailable(UsageError):
    """The hub cannot be reached or a download broke off (one sentence); exit 1, since a restart may succeed."""

    exit_code = 1


def _model_setting() -> str:
    s = S.REGISTRY["model"]
    return f"{s.flag_name}/{s.env_name}"


def _revision_setting() -> str:
    s = S.REGISTRY["model_revision"]
    return f"{s.flag_name}/{s.env_name}"


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


# ---- the layout ---------------------------------------------------------------------------------------

def hub_cache(models_dir: str) -> str:
    """The huggingface_hub cache directory of the models volume."""
    return os.path.join(os.path.abspath(models_dir), HUB_SUBDIR)


def repo_folder(repo_id: str) -> str:
    return "--".join(["models", *repo_id.split("/")])       # huggingface_hub's repo_folder_name for models


def storage_dir(cache: str, repo_id: str) -> str:
    return os.path.join(cache, repo_folder(repo_id))


def snapshot_dir(cache: str, repo_id: str, commit: str) -> str:
    return os.path.join(storage_dir(cache, repo_id), "snapshots", commit)


def parse_snapshot_dir(path: str) -> tuple[str, str, str] | None:
    """(cache, repo_id, commit) when path is a snapshot directory of a hub cache, else None (a plain model dir)."""
    path = os.path.abspath(path)
    rest, commit = os.path.split(path)
    rest, snapshots = os.path.split(rest)
    cache, folder = os.path.split(rest)
    parts = folder.split("--")
    if snapshots != "snapshots" or not COMMIT.fullmatch(commit) or len(parts) != 3 or parts[0] != "models":
        return None
    repo_id = f"{parts[1]}/{parts[2]}"
    return (cache, repo_id, commit) if S.is_hub_id(repo_id) else None


def offline(env: Mapping[str, str] | None = None) -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to a true value: in env when given, else as huggingface_hub read
    the process environment (at its import)."""
    if env is not None:
        return any((env.get(k) or "").strip().upper() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    from huggingface_hub import constants
    return bool(constants.HF_HUB_OFFLINE)


# ---- the listing ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HubFile:
    path: str                     # inside the repo, "/"-separated
    size: int
    sha256: str | None = None     # LFS files
    blob_id: str | None = None    # the git blob id (sha1) of the others


@dataclass(frozen=True)
class Listing:
    """What the hub lists for one commit of a repo (the files turingbox fetches: select_files)."""
    repo_id: str
    revision: str                 # what was asked for (a branch, tag or the commit)
    commit: str
    files: tuple[HubFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def get(self, path: str) -> HubFile | None:
        return next((f for f in self.files if f.path == path), None)

    def to_json(self) -> dict:
        return {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit,
                "files": [{k: v for k, v in vars(f).items() if v is not None} for f in self.files]}

    @classmethod
    def from_json(cls, d: dict) -> "Listing":
        return cls(d["repo_id"], d["revision"], d["commit"],
                   tuple(HubFile(f["path"], int(f["size"]), f.get("sha256"), f.get("blob_id")) for f in d["files"]))


def select_files(files: Iterable[HubFile]) -> tuple[HubFile, ...]:
    """The files vLLM needs: all of them, except other weight formats where safetensors weights are there."""
    files = tuple(files)
    if not any(f.path.endswith(".safetensors") for f in files):
        return files
    return tuple(f for f in files if not any(fnmatch.fnmatch(f.path, p) for p in OTHER_WEIGHTS))


def _network_errors() -> tuple[type[BaseException], ...]:
    import importlib
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    # huggingface_hub 0.x uses requests (transformers 4.57 keeps it there), 1.x httpx, later ones httpx2
    for module, names in (("requests.exceptions", ("ConnectionError", "Timeout")), ("httpx", ("TransportError",)),
                          ("httpx2", ("TransportError",))):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        errors += [getattr(mod, n) for n in names if hasattr(mod, n)]
    return tuple(errors)


def _endpoint(endpoint: str | None) -> str:
    from huggingface_hub import constants
    return (endpoint or constants.ENDPOINT).rstrip("/")


def _token_state() -> str:
    from huggingface_hub import get_token     # HF_TOKEN, or a token saved by `hf auth login`
    try:
        return "is set" if get_token() else "is not set"
    except Exception:
        return "is not readable"


def _explain(exc: BaseException, repo_id: str, revision: str, endpoint: str | None, what: str) -> UsageError | None:
    """One sentence for a huggingface_hub or network failure (None: not one of those, a bug to re-raise)."""
    from huggingface_hub import errors as E
    where = f"the Hugging Face hub ({_endpoint(endpoint)})"
    if isinstance(exc, E.GatedRepoError):
        return UsageError(f"{_model_setting()} {repo_id} is gated on {where}: accept its conditions on its page and "
                          f"set HF_TOKEN to a token of that account (HF_TOKEN {_token_state()}).")
    if isinstance(exc, E.RepositoryNotFoundError):
        return UsageError(f"{_model_setting()} {repo_id} is not a model on {where}, or it is private and HF_TOKEN "
                          f"{_token_state()}{'' if _token_state() == 'is not set' else ' but gives no access to it'}.")
    if isinstance(exc, E.RevisionNotFoundError):
        return UsageError(f"{_revision_setting()} {revision} is not a branch, tag or commit of {repo_id} on {where}.")
    if isinstance(exc, E.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            return UsageError(f"{where} refused {what} of {repo_id} ({status}); HF_TOKEN {_token_state()}: set it to "
                              f"a token that may read {repo_id}.")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return HubUnavailable(f"{where} failed {what} of {repo_id} ({first.rstrip('.')}).")
    if isinstance(exc, _network_errors()):
        return HubUnavailable(f"{where} cannot be reached for {what} of {repo_id} ({type(exc).__name__}: "
                              f"{str(exc).strip() or 'no detail'}); check the network or HF_ENDPOINT, or set "
                              f"HF_HUB_OFFLINE=1 to serve what the models volume holds.")
    return None


def _lfs_field(lfs: Any, key: str) -> Any:
    """A field of a sibling's LFS info: a dict in some huggingface_hub versions, attributes in others."""
    if not lfs:
        return None
    return lfs.get(key) if isinstance(lfs, dict) else getattr(lfs, key, None)


def list_remote(repo_id: str, revision: str | None = None, endpoint: str | None = None) -> Listing:
    """The hub's listing of repo_id at revision (one API call; HF_TOKEN read by huggingface_hub)."""
    from huggingface_hub import HfApi
    revision = revision or DEFAULT_REVISION
    try:
        info = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision, files_metadata=True)
    except Exception as exc:
        explained = _explain(exc, repo_id, revision, endpoint, "the file listing")
        if explained is None:
            raise
        raise explained from None
    files = []
    for s in info.siblings or []:
        size = s.size if s.size is not None else _lfs_field(s.lfs, "size")
        if size is None:
            raise HubUnavailable(f"the Hugging Face hub's listing of {repo_id} gives no size for {s.rfilename}, so "
                                 "its download cannot be checked.")
        files.append(HubFile(s.rfilename, int(size), _lfs_field(s.lfs, "sha256"), None if s.lfs else s.blob_id))
    if not info.sha or not COMMIT.fullmatch(info.sha):
        raise HubUnavailable(f"the Hugging Face hub gave no commit for {repo_id} at revision {revision}.")
    return Listing(repo_id, revision, info.sha, select_files(files))


# ---- what the volume holds ---------------------------------------------------------------------------

def _atomic_write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)          # mkstemp's 0600 would hide it from other users of a shared volume
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_ref(cache: str, repo_id: str, revision: str) -> str | None:
    if COMMIT.fullmatch(revision):
        return revision
    try:
        with open(os.path.join(storage_dir(cache, repo_id), "refs", revision)) as f:
            commit = f.read().strip()
    except OSError:
        return None
    return commit if COMMIT.fullmatch(commit) else None


def write_ref(cache: str, repo_id: str, revision: str, commit: str) -> None:
    if not COMMIT.fullmatch(revision) and read_ref(cache, repo_id, revision) != commit:
        _atomic_write(os.path.join(storage_dir(cache, repo_id), "refs", revision), commit)


def read_manifest(cache: str, repo_id: str, commit: str) -> Listing | None:
    try:
        with open(os.path.join(storage_dir(cache, repo_id), MANIFEST_DIR, commit + ".json")) as f:
            return Listing.from_json(json.load(f))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_manifest(cache: str, listing: Listing) -> None:
    path = os.path.join(storage_dir(cache, listing.repo_id), MANIFEST_DIR, listing.commit + ".json")
    _atomic_write(path, json.dumps(listing.to_json(), indent=1) + "\n")


def _present(path: str, size: int) -> bool:
    try:
        return os.path.isfile(path) and os.path.getsize(path) == size
    except OSError:
        return False


def _local_path(snapshot: str, f: HubFile) -> str:
    return os.path.join(snapshot, *f.path.split("/"))


def missing_files(snapshot: str, files: Iterable[HubFile]) -> tuple[HubFile, ...]:
    """The listed files that the snapshot lacks, or holds with another size."""
    return tuple(f for f in files if not _present(_local_path(snapshot, f), f.size))


def _names(files: Iterable[HubFile], n: int = 3) -> str:
    files = list(files)
    shown = ", ".join(f.path for f in files[:n])
    return shown + (f" and {len(files) - n} more" if len(files) > n else "")


def _offline_fix(repo_id: str, revision: str, cache: str) -> str:
    rev = "" if revision == DEFAULT_REVISION else f" --revision {revision}"
    return (f"start once with network access (HF_HUB_OFFLINE unset) to download it, or fill the volume with "
            f"`hf download {repo_id}{rev} --cache-dir {cache}`")


# ---- planning: config.json -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ConfigSource:
    """What the planner needs of a hub model: its config.json and where serve keeps its snapshot."""
    repo_id: str
    revision: str
    commit: str
    path: str                           # the snapshot directory (absent until serve downloads it)
    config: dict
    listing: Listing | None             # None: offline, and the volume has no listing of this commit
    missing: tuple[HubFile, ...]        # the listed files the volume lacks
    note: str                           # a sentence for the plan's reasons


def model_config(repo_id: str, revision: str | None, models_dir: str, *, write: bool,
                 endpoint: str | None = None, env: Mapping[str, str] | None = None) -> ConfigSource:
    """config.json of a hub model, for planning.

    write False (`turingbox plan`): writes nothing; config.json comes from the volume's snapshot, or from the hub
    into memory. write True (serve): config.json, the listing and refs/<revision> go into the volume, and the rest
    is left to ensure_snapshot() (serve's downloading stage). Offline, only the volume is read.
    """
    revision = revision or DEFAULT_REVISION
    cache = hub_cache(models_dir)
    if offline(env):
        return _config_from_volume(repo_id, revision, cache, why="HF_HUB_OFFLINE is set")
    try:
        listing = list_remote(repo_id, revision, endpoint)
    except HubUnavailable as exc:
        commit = read_ref(cache, repo_id, revision)
        local = read_manifest(cache, repo_id, commit) if commit else None
        if local is None or missing_files(snapshot_dir(cache, repo_id, commit), local.files):
            raise
        log.warning("%s Planning from the complete snapshot in the models volume.", exc)
        return _config_from_volume(repo_id, revision, cache, why="the hub could not be reached")
    snapshot = snapshot_dir(cache, repo_id, listing.commit)
    entry = listing.get(CONFIG_FILE)
    if entry is None:
        raise UsageError(f"{_model_setting()} {repo_id} has no {CONFIG_FILE} at revision {revision}: it is not a "
                         "transformers model that vLLM can serve.")
    if write:
        _prepare_dirs(cache, repo_id)
        write_manifest(cache, listing)
        write_ref(cache, repo_id, revision, listing.commit)
        if missing_files(snapshot, [entry]):
            fetch_files(cache, listing, [entry], endpoint=endpoint)
    fetched = ""
    if not missing_files(snapshot, [entry]):
        config = _parse_config(_read(_local_path(snapshot, entry)), repo_id, _local_path(snapshot, entry))
    else:
        config = _parse_config(_fetch_into_memory(listing, entry, endpoint), repo_id, f"{repo_id}/{CONFIG_FILE}")
        fetched = f"; `turingbox plan` read only {CONFIG_FILE} from the hub and wrote nothing"
    missing = missing_files(snapshot, listing.files)
    head = f"model: {repo_id} from the Hugging Face hub (revision {revision}, commit {listing.commit[:12]})"
    if not missing:
        note = (f"{head}: all {len(listing.files)} files ({_gib(listing.total_bytes)}) are in the models volume at "
                f"{snapshot}.")
    else:
        verb = "downloads" if write else "would download"
        note = (f"{head}: serve {verb} {len(missing)} of its {len(listing.files)} files "
                f"({_gib(sum(f.size for f in missing))}) into {snapshot} before it starts vLLM{fetched}.")
    return ConfigSource(repo_id, revision, listing.commit, snapshot, config, listing, missing, note)


def _config_from_volume(repo_id: str, revision: str, cache: str, why: str) -> ConfigSource:
    commit = read_ref(cache, repo_id, revision)
    if commit is None or not os.path.isfile(os.path.join(snapshot_dir(cache, repo_id, commit), CONFIG_FILE)):
        raise UsageError(f"{_model_setting()} {repo_id} (revision {revision}) is not in the models volume "
                         f"({cache}) and {why}, so it cannot be downloaded; {_offline_fix(repo_id, revision, cache)}.")
    snapshot = snapshot_dir(cache, repo_id, commit)
    path = os.path.join(snapshot, CONFIG_FILE)
    config = _parse_config(_read(path), repo_id, path)
    listing = read_manifest(cache, repo_id, commit)
    missing = missing_files(snapshot, listing.files) if listing else ()
    head = f"model: {repo_id} from the models volume at {snapshot} (revision {revision}, {why})"
    if listing is None:
        note = f"{head}; no turingbox listing of this commit, so its completeness is not checked."
    elif missing:
        note = (f"{head}: {len(missing)} of its {len(listing.files)} files are missing ({_names(missing)}), and serve "
                f"cannot start until they are there.")
    else:
        note = f"{head}: all {len(listing.files)} files ({_gib(listing.total_bytes)}) are there."
    return ConfigSource(repo_id, revision, commit, snapshot, config, listing, missing, note)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _parse_config(raw: bytes, repo_id: str, where: str) -> dict:
    try:
        cfg = json.loads(raw)
    except ValueError as exc:
        raise UsageError(f"{where} of {repo_id} is not valid JSON ({str(exc).splitlines()[0]}).") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"{where} of {repo_id} does not hold a JSON object.")
    return cfg


def _fetch_into_memory(listing: Listing, f: HubFile, endpoint: str | None) -> bytes:
    import io

    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers
    _quiet()
    buf = io.BytesIO()
    url = hf_hub_url(listing.repo_id, f.path, revision=listing.commit, endpoint=endpoint)
    try:
        http_get(url, buf, headers=build_hf_headers(), expected_size=f.size)
    except Exception as exc:
        explained = _explain(exc, listing.repo_id, listing.revision, endpoint, f"the download of {f.path}")
        if explained is None:
            raise
        raise explained from None
    data = buf.getvalue()
    problem = _check_bytes(data, f)
    if problem:
        raise HubUnavailable(f"{f.path} of {listing.repo_id} from the Hugging Face hub {problem}.")
    return data


# ---- serving: the whole snapshot --------------------------------------------------------------------

@dataclass(frozen=True)
class Progress:
    """Where a download stands: what the downloading stage shows in /health/ready."""
    repo_id: str
    bytes_done: int
    bytes_total: int
    files_done: int
    files_total: int
    bytes_per_s: float | None = None     # this run's rate (None until bytes arrived)

    @property
    def percent(self) -> float:
        return 100.0 if not self.bytes_total else min(100.0, 100.0 * self.bytes_done / self.bytes_total)

    @property
    def seconds_left(self) -> float | None:
        if not self.bytes_per_s:
            return None
        return max(0.0, (self.bytes_total - self.bytes_done) / self.bytes_per_s)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.repo_id, "bytes": self.bytes_done, "total_bytes": self.bytes_total,
                "percent": round(self.percent, 1), "files": self.files_done, "total_files": self.files_total,
                "bytes_per_s": None if self.bytes_per_s is None else round(self.bytes_per_s)}

    def describe(self) -> str:
        rate = f", {self.bytes_per_s / 1e6:.1f} MB/s" if self.bytes_per_s else ""
        return (f"{self.percent:.0f}% ({self.bytes_done / 2**30:.2f} of {_gib(self.bytes_total)}, "
                f"{self.files_done} of {self.files_total} files{rate})")


ProgressFn = Callable[[Progress], None]


def is_complete(path: str) -> bool:
    """Whether the hub snapshot directory holds every file of its listing (False without a listing); no request."""
    parsed = parse_snapshot_dir(path)
    if parsed is None:
        return os.path.isdir(path)
    cache, repo_id, commit = parsed
    listing = read_manifest(cache, repo_id, commit)
    return listing is not None and not missing_files(path, listing.files)


def ensure_snapshot(path: str, *, progress: ProgressFn | None = None, endpoint: str | None = None,
                    env: Mapping[str, str] | None = None) -> str:
    """Make the snapshot directory `path` (a plan's model, from model_config) complete; returns path.

    A path that is no hub snapshot is returned as it is. Online, the missing files are downloaded (resumed where a
    previous start left them, verified, with progress); a snapshot the volume's listing calls complete needs no
    request at all. Offline, a missing file is a UsageError naming it and how to get it.
    """
    parsed = parse_snapshot_dir(path)
    if parsed is None:
        return path
    cache, repo_id, commit = parsed
    listing = read_manifest(cache, repo_id, commit)
    if listing is not None and not missing_files(path, listing.files):
        _report(progress, repo_id, listing.total_bytes, listing.total_bytes, len(listing.files), len(listing.files))
        return path
    if offline(env):
        if listing is None:
            if os.path.isfile(os.path.join(path, CONFIG_FILE)):
                log.warning("%s at %s has no turingbox listing (HF_HUB_OFFLINE is set), so its completeness is not "
                            "checked", repo_id, path)
                return path
            raise UsageError(f"{_model_setting()} {repo_id} (commit {commit}) is not in the models volume ({cache}) "
                             f"and HF_HUB_OFFLINE is set; {_offline_fix(repo_id, commit, cache)}.")
        missing = missing_files(path, listing.files)
        size = _gib(sum(f.size for f in missing))
        raise UsageError(f"{_model_setting()} {repo_id} is incomplete in the models volume: {len(missing)} of its "
                         f"{len(listing.files)} files are missing ({_names(missing)}, {size}) and HF_HUB_OFFLINE is "
                         f"set; {_offline_fix(repo_id, listing.revision, cache)}.")
    if listing is None:
        listing = list_remote(repo_id, commit, endpoint)
        _prepare_dirs(cache, repo_id)
        write_manifest(cache, listing)
    fetch_files(cache, listing, listing.files, progress=progress, endpoint=endpoint)
    missing = missing_files(path, listing.files)
    if missing:     # fetch_files raises on every failure it sees; this guards the layout huggingface_hub made
        raise HubUnavailable(f"after downloading {repo_id}, {len(missing)} files are still missing from {path} "
                             f"({_names(missing)}).")
    write_ref(cache, repo_id, listing.revision, listing.commit)
    return path


def _prepare_dirs(cache: str, repo_id: str) -> None:
    storage = storage_dir(cache, repo_id)
    try:
        os.makedirs(os.path.join(storage, "blobs"), exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {storage} ({exc.strerror or exc}), so {repo_id} cannot be downloaded into "
                         f"the models volume; point {S.REGISTRY['models_dir'].env_name} at a writable volume.") from None
    if not os.access(storage, os.W_OK) or not os.access(os.path.join(storage, "blobs"), os.W_OK):
        raise UsageError(f"{storage} is not writable, so {repo_id} cannot be downloaded into the models volume; point "
                         f"{S.REGISTRY['models_dir'].env_name} at a writable volume, or fill it beforehand and set "
                         "HF_HUB_OFFLINE=1.")


def _report(progress: ProgressFn | None, repo_id: str, done: int, total: int, files_done: int, files_total: int,
            rate: float | None = None) -> Progress:
    p = Progress(repo_id, done, total, files_done, files_total, rate)
    if progress is not None:
        try:
            progress(p)
        except Exception:         # a display problem must not stop the download
            log.exception("progress callback failed")
    return p


def _quiet() -> None:
    """huggingface_hub's tqdm bars off: serve logs its own progress lines."""
    from huggingface_hub.utils import disable_progress_bars
    disable_progress_bars()


def fetch_files(cache: str, listing: Listing, files: Iterable[HubFile], *, progress: ProgressFn | None = None,
                endpoint: str | None = None) -> None:
    """Download the listed files of one commit into the cache (resumed, verified, linked by huggingface_hub)."""
    files = tuple(files)
    snapshot = snapshot_dir(cache, listing.repo_id, listing.commit)
    todo = missing_files(snapshot, files)
    total = sum(f.size for f in files)
    have = total - sum(f.size for f in todo)
    storage = storage_dir(cache, listing.repo_id)
    partial = {f.path: _partial_bytes(storage, f) for f in todo}
    need = sum(f.size for f in todo) - sum(partial.values())
    free = shutil.disk_usage(storage).free if os.path.isdir(storage) else None
    if free is not None and need > free:
        raise UsageError(f"the models volume ({cache}) has {_gib(free)} free, but {listing.repo_id} needs {_gib(need)} "
                         f"more for {len(todo)} files; make room or give {S.REGISTRY['models_dir'].env_name} a larger "
                         "volume.")
    if not todo:
        _report(progress, listing.repo_id, total, total, len(files), len(files))
        return
    _quiet()
    already = have + sum(partial.values())
    if len(files) > 1:
        log.info("downloading %s (commit %s): %d of %d files, %s to fetch%s, into %s", listing.repo_id,
                 listing.commit[:12], len(todo), len(files), _gib(need),
                 f" (resuming {_gib(sum(partial.values()))})" if any(partial.values()) else "", snapshot)
    run = _Run(listing, cache, snapshot, endpoint, todo)
    monitor = _Monitor(run, progress, total, len(files), have, len(files) - len(todo), already,
                       log_lines=len(files) > 1)
    monitor.start()
    try:
        run.go()
    finally:
        monitor.stop()
    if run.error is not None:
        raise run.error
    monitor.final()


def _partial_bytes(storage: str, f: HubFile) -> int:
    """Bytes of f a previous start left in blobs/<etag>.incomplete (the etag is the sha256 for LFS files and the
    git blob id for the others on the Hugging Face hub; 0 when unknown)."""
    etag = f.sha256 or f.blob_id
    if not etag:
        return 0
    try:
        return min(os.path.getsize(os.path.join(storage, "blobs", etag + ".incomplete")), f.size)
    except OSError:
        return 0


class _Run:
    """The downloads of one fetch_files call, on daemon threads (an exiting serve never waits for them)."""

    def __init__(self, listing: Listing, cache: str, snapshot: str, endpoint: str | None,
                 todo: tuple[HubFile, ...]) -> None:
        self.listing, self.cache, self.snapshot, self.endpoint = listing, cache, snapshot, endpoint
        self.queue = list(todo)
        self.lock = threading.Lock()
        self.active: dict[str, str] = {}          # repo path -> its .incomplete file while it downloads
        self.done_bytes = 0                       # of the files finished in this run
        self.done_files = 0
        self.error: BaseException | None = None

    def go(self) -> None:
        threads = [threading.Thread(target=self._work, daemon=True, name=f"hub-download-{i}")
                   for i in range(min(WORKERS, len(self.queue)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _work(self) -> None:
        while True:
            with self.lock:
                if self.error is not None or not self.queue:
                    return
                f = self.queue.pop(0)
            try:
                _fetch_one(self, f)
            except BaseException as exc:
                with self.lock:
                    if self.error is None:
                        self.error = exc
                return
            with self.lock:
                self.active.pop(f.path, None)
                self.done_bytes += f.size
                self.done_files += 1

    def bytes_now(self) -> tuple[int, int]:
        with self.lock:
            parts = list(self.active.values())
            done, files = self.done_bytes, self.done_files
        for p in parts:
            with contextlib.suppress(OSError):
                done += os.path.getsize(p)
        return done, files


class _Monitor:
    """Calls the progress callback every PROGRESS_INTERVAL_S and logs a line per LOG_STEP_PERCENT."""

    def __init__(self, run: _Run, progress: ProgressFn | None, total: int, files_total: int, have: int,
                 have_files: int, already: int, log_lines: bool) -> None:
        self.run, self.progress, self.total, self.files_total = run, progress, total, files_total
        self.have, self.have_files, self.already, self.log_lines = have, have_files, already, log_lines
        self.started = time.monotonic()
        self.logged_step = int(100.0 * already / total // LOG_STEP_PERCENT) if total else 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="hub-progress")

    def start(self) -> None:
        self.tick()
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopped.wait(PROGRESS_INTERVAL_S):
            self.tick()

    def tick(self) -> Progress:
        done, files = self.run.bytes_now()
        done += self.have
        elapsed = time.monotonic() - self.started
        rate = (done - self.already) / elapsed if elapsed > 0 and done > self.already else None
        p = _report(self.progress, self.run.listing.repo_id, min(done, self.total), self.total,
                    self.have_files + files, self.files_total, rate)
        step = int(p.percent // LOG_STEP_PERCENT)
        if self.log_lines and step > self.logged_step:
            self.logged_step = step
            log.info("downloading %s: %s", self.run.listing.repo_id, p.describe())
        return p

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)

    def final(self) -> None:
        p = self.tick()
        if self.log_lines:
            log.info("downloaded %s: %d files, %s in %.1f s", self.run.listing.repo_id, p.files_total,
                     _gib(p.bytes_total), time.monotonic() - self.started)


def _fetch_one(run: _Run, f: HubFile) -> None:
    from filelock import FileLock
    from huggingface_hub import hf_hub_download, hf_hub_url
    from huggingface_hub.file_download import get_hf_file_metadata, http_get
    from huggingface_hub.utils import build_hf_headers

    listing = run.listing
    repo_id = listing.repo_id
    url = hf_hub_url(repo_id, f.path, revision=listing.commit, endpoint=run.endpoint)
    what = f"the download of {f.path}"
    try:
        meta = get_hf_file_metadata(url)
    except Exception as exc:
        raise (_explain(exc, repo_id, listing.revision, run.endpoint, what) or exc) from None
    if meta.size is not None and meta.size != f.size:
        raise HubUnavailable(f"the Hugging Face hub serves {f.path} of {repo_id} with {meta.size} bytes, but its "
                             f"listing says {f.size}; start again to fetch a fresh listing.")
    if not meta.etag:
        raise HubUnavailable(f"the Hugging Face hub gave no ETag for {f.path} of {repo_id}.")
    storage = storage_dir(run.cache, repo_id)
    blob = os.path.join(storage, "blobs", meta.etag)
    part = blob + ".incomplete"
    locks = os.path.join(run.cache, ".locks", repo_folder(repo_id))
    os.makedirs(locks, exist_ok=True)
    os.makedirs(os.path.dirname(blob), exist_ok=True)
    with run.lock:
        run.active[f.path] = part
    with FileLock(os.path.join(locks, meta.etag + ".lock")):   # huggingface_hub's lock of this blob
        if not _present(blob, f.size):
            headers = build_hf_headers()
            target = url
            if meta.location and meta.location != url:
                target = meta.location
                if urlparse(target).netloc != urlparse(url).netloc:
                    headers.pop("authorization", None)       # a signed CDN address: no token there
            resume = os.path.getsize(part) if os.path.exists(part) else 0
            if resume > f.size:
                os.unlink(part)
                resume = 0
            if resume:
                log.info("resuming %s of %s at %s", f.path, repo_id, _gib(resume))
            try:
                with open(part, "ab") as fh:
                    http_get(target, fh, resume_size=resume, headers=headers, expected_size=f.size)
            except Exception as exc:
                # the partial file stays for the next start to resume (a size mismatch is checked below)
                explained = _explain(exc, repo_id, listing.revision, run.endpoint, what)
                if explained is None and isinstance(exc, OSError):
                    explained = HubUnavailable(f"{what} of {repo_id} failed ({exc}).")
                raise (explained or exc) from None
            problem = _check_file(part, f)
            if problem:
                with contextlib.suppress(OSError):
                    os.unlink(part)
                raise HubUnavailable(f"{f.path} of {repo_id} as downloaded {problem}, so it was deleted; start again "
                                     "to download it anew.")
            os.replace(part, blob)
    try:     # huggingface_hub links the blob into the snapshot (its own layout, symlinks or copies)
        hf_hub_download(repo_id, f.path, revision=listing.commit, cache_dir=run.cache, endpoint=run.endpoint)
    except Exception as exc:
        raise (_explain(exc, repo_id, listing.revision, run.endpoint, what) or exc) from None
    if not _present(_local_path(run.snapshot, f), f.size):
        raise HubUnavailable(f"{f.path} of {repo_id} is not in {run.snapshot} after its download.")


def _check_file(path: str, f: HubFile) -> str | None:
    """Why the file does not match the listing (size, sha256 or git blob id), or None."""
    size = os.path.getsize(path)
    if size != f.size:
        return f"has {size} bytes, not the {f.size} the hub lists"
    if f.sha256:
        h = hashlib.sha256()
    elif f.blob_id:
        h = hashlib.sha1(b"blob %d\0" % size)
    else:
        return None
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(8 << 20), b""):
            h.update(chunk)
    want = f.sha256 or f.blob_id
    if h.hexdigest() != want:
        return f"has {'sha256' if f.sha256 else 'git blob id'} {h.hexdigest()}, not the {want} the hub lists"
    return None


def _check_bytes(data: bytes, f: HubFile) -> str | None:
    if len(data) != f.size:
        return f"has {len(data)} bytes, not the {f.size} the hub lists"
    if f.sha256 and hashlib.sha256(data).hexdigest() != f.sha256:
        return "does not have the sha256 the hub lists"
    if not f.sha256 and f.blob_id and hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() != f.blob_id:
        return "does not have the git blob id the hub lists"
    return None
