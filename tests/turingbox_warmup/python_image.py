"""A tiny stand-in for the appliance image, for Docker tests of `make bake` (seconds, not minutes).

`docker import` of a minimal file tree: this machine's Debian python3.11 (interpreter, standard
library without tests/GUI, and exactly the shared libraries `ldd` says it and its extension
modules need), the repository's own packages (turingbox, turingbox_plugin, turingbox_warmup) plus THIRD_PARTY, a
`turingbox` console script, the Qwen3.6-27B config as /models/qwen36, and a writable /cache. Enough to
run `turingbox plan | cache | warmup` (the parts bake relies on) in a container without a GPU. The tag
carries a hash of the contents, so a code change rebuilds it.

Set TURINGBOX_BAKE_TEST_IMAGE=turingbox:0.1.0 to run the same tests on the real appliance image.
"""
from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = "/usr/bin/python3.11"
STDLIB = "/usr/lib/python3.11"
SKIP_STDLIB = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data",
               "config-3.11-x86_64-linux-gnu", "__pycache__", "site-packages", "dist-packages"}
SITE = "/opt/turingbox/site"
PACKAGES = {"turingbox": os.path.join(REPO, "entrypoint", "turingbox"),
            "turingbox_plugin": os.path.join(REPO, "plugin", "turingbox_plugin"),
            "turingbox_warmup": os.path.join(REPO, "warmup", "turingbox_warmup")}
# third-party packages the commands bake runs import (`warmup`: the Engine's health client), pure Python
THIRD_PARTY = ("filelock", "httpx", "httpcore", "h11", "anyio", "sniffio", "idna", "certifi")
REPOSITORY = "turingbox-bake-test"
SCRIPT = f"""#!{PYTHON}
import sys
sys.path.insert(0, {SITE!r})
from turingbox.cli import main
sys.exit(main())
"""
CHANGES = [
    f"ENV PYTHONPATH={SITE}",
    "ENV TURINGBOX_CACHE_DIR=/cache",
    "ENV TURINGBOX_MODEL=/models/qwen36",
    "ENV TURINGBOX_RUNTIME_DIR=/tmp/turingbox-runtime",
    "ENV PYTHONDONTWRITEBYTECODE=1",
    "ENV HOME=/tmp",
    "LABEL org.opencontainers.image.version=0.1.0",
    'ENTRYPOINT ["turingbox"]',
]


def available() -> str | None:
    """Why the image cannot be built here, or None."""
    if not os.path.exists(PYTHON):
        return f"{PYTHON} (Debian's python3.11) is not installed on this machine"
    return None


def _shared_libs(paths: list[str]) -> set[str]:
    libs = set()
    for chunk in range(0, len(paths), 64):
        out = subprocess.run(["ldd", *paths[chunk:chunk + 64]], capture_output=True, text=True).stdout
        for line in out.splitlines():
            line = line.strip()
            if line.endswith(":"):      # ldd's "file:" header when given several files
                continue
            if "=>" in line:
                target = line.split("=>", 1)[1].split("(")[0].strip()
            elif line.startswith("/"):
                target = line.split("(")[0].strip()
            else:
                continue
            if target.startswith("/"):
                libs.add(target)
    return libs


def _tree() -> list[tuple[str, str]]:
    """(path in the image, path here) of every file in the image."""
    files = [(PYTHON, PYTHON)]
    for dirpath, dirs, names in os.walk(STDLIB):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_STDLIB)
        files += [(os.path.join(dirpath, n), os.path.join(dirpath, n)) for n in sorted(names)
                  if not n.endswith((".pyc", ".exe"))]
    so = [p for p, _ in files if p.endswith(".so")] + [PYTHON]
    for lib in sorted(_shared_libs(so)):
        files.append((lib, os.path.realpath(lib)))
    import importlib
    sources = dict(PACKAGES, **{name: os.path.dirname(importlib.import_module(name).__file__) for name in THIRD_PARTY})
    for name, src in sorted(sources.items()):
        for dirpath, dirs, names in os.walk(src):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for n in sorted(names):
                if n.endswith((".pyc", ".so", ".o")):
                    continue
                here = os.path.join(dirpath, n)
                files.append((os.path.join(SITE, name, os.path.relpath(here, src)), here))
    return files


def _tarball(files: list[tuple[str, str]]) -> tuple[bytes, str]:
    buf = io.BytesIO()
    digest = hashlib.sha256()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)

        def add_bytes(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
            digest.update(name.encode() + hashlib.sha256(data).digest())

        add_dir("tmp", 0o1777)
        add_dir("cache", 0o777)
        add_dir("usr/local/bin")
        add_bytes("usr/local/bin/turingbox", SCRIPT.encode(), 0o755)
        link = tarfile.TarInfo("usr/bin/python3")
        link.type, link.linkname = tarfile.SYMTYPE, "python3.11"
        tar.addfile(link)
        with open(os.path.join(PACKAGES["turingbox"], "data", "qwen3.6-27b.json"), "rb") as f:
            add_bytes("models/qwen36/config.json", f.read())
        add_bytes("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nturingbox:x:10001:10001::/tmp:/bin/sh\n")
        add_bytes("etc/group", b"root:x:0:\nturingbox:x:10001:\n")
        seen = set()
        for inside, here in files:
            name = inside.lstrip("/")
            if name in seen:
                continue
            seen.add(name)
            with open(here, "rb") as f:
                data = f.read()
            add_bytes(name, data, os.stat(here).st_mode & 0o777)
    digest.update("\n".join(CHANGES).encode())
    return buf.getvalue(), digest.hexdigest()[:12]


def ensure(client) -> str:
    """The tag of the tiny image, built (docker import) only when its contents changed."""
    data, digest = _tarball(_tree())
    tag = f"{REPOSITORY}:{digest}"
    try:
        client.images.get(tag)
        return tag
    except Exception:
        pass
    client.api.import_image(src=io.BytesIO(data), repository=REPOSITORY, tag=digest, changes=CHANGES)
    return tag
