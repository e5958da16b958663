"""`make warmup-cache`: seed the named cache volume by running the image on this host's GPUs.

Host side, Docker SDK only: runs `turingbox warmup --seed-only` in the image with every GPU, the
same TURINGBOX_* environment compose passes, and the cache volume at /cache; streams the
container log with a progress bar driven by the `turingbox-stage:` lines; prints the fingerprint
and sizes; exits non-zero when the seed fails.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Iterable, Mapping

from turingbox_warmup.seed_protocol import STAGES, is_result, result_of, stage_of
from turingbox.config import envs

CACHE_MOUNT = "/cache"
# compose.yaml names its cache volume `cache`; compose prefixes it with the project name.
DEFAULT_VOLUME = "turingbox_cache"


def passthrough_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment compose gives the service: every TURINGBOX_* variable of the host, with the
    cache root pinned to the mounted volume."""
    env = {k: v for k, v in environ.items() if k.startswith("TURINGBOX_")}
    env["TURINGBOX_CACHE_DIR"] = CACHE_MOUNT
    return env


def container_kwargs(image: str, volume: str, environ: Mapping[str, str], extra_args: Iterable[str] = ()) -> dict:
    """Arguments for docker-py's containers.run (detached), GPUs via the NVIDIA device request."""
    import docker.types
    return {
        "image": image,
        "command": ["turingbox", "warmup", "--seed-only", *extra_args],
        "environment": passthrough_env(environ),
        "volumes": {volume: {"bind": CACHE_MOUNT, "mode": "rw"}},
        "device_requests": [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])],
        "detach": True,
        "labels": {"turingbox.role": "warmup-cache"},
    }


class Progress:
    """Turns the container's log lines into (stage index, result)."""

    def __init__(self) -> None:
        self.stage = -1
        self.result: dict[str, Any] | None = None
        self.tail: list[str] = []

    def feed(self, line: str) -> bool:
        """Consume one log line; True when it advanced the stage."""
        line = line.rstrip("\n")
        self.tail = (self.tail + [line])[-40:]
        if is_result(line):
            result = result_of(line)
            if result is not None:      # a cut or broken result line leaves the last good one
                self.result = result
            return False
        name = stage_of(line)
        if name is not None and STAGES.index(name) > self.stage:
            self.stage = STAGES.index(name)
            return True
        return False

    @property
    def stage_name(self) -> str:
        return STAGES[self.stage] if self.stage >= 0 else "starting"


def split_lines(chunks: Iterable[bytes]) -> Iterable[str]:
    """Docker log chunks (arbitrary byte boundaries) -> text lines."""
    buf = b""
    for chunk in chunks:
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.decode("utf-8", "replace")
    if buf:
        yield buf.decode("utf-8", "replace")


def summary(result: Mapping[str, Any]) -> str:
    sizes = result.get("sizes") or {}
    total = sum(s.get("bytes", 0) for s in sizes.values())
    parts = ", ".join(f"{k} {v.get('files', 0)} files {v.get('bytes', 0) / 2**20:.1f} MiB" for k, v in sizes.items())
    return (f"cache_key {result.get('cache_key')} ({result.get('result')}, {result.get('mode')} entry)\n"
            f"  gpu {result.get('gpu_name')}, TP {result.get('tensor_parallel_size')}, "
            f"MTP {result.get('num_speculative_tokens')}\n  total {total / 2**20:.1f} MiB: {parts}")


def run(client, image: str, volume: str, environ: Mapping[str, str], extra_args: Iterable[str] = (),
        out=sys.stdout, quiet: bool = False) -> int:
    from tqdm import tqdm
    container = client.containers.run(**container_kwargs(image, volume, environ, extra_args))
    progress = Progress()
    bar = tqdm(total=len(STAGES), desc="starting", unit="stage", file=sys.stderr, disable=quiet)
    try:
        for line in split_lines(container.logs(stream=True, follow=True)):
            if progress.feed(line):
                bar.update(progress.stage + 1 - bar.n)
                bar.set_description(progress.stage_name)
            elif not is_result(line):
                bar.write(line, file=sys.stderr)
        code = int(container.wait().get("StatusCode", 1))
    finally:
        bar.close()
        try:
            container.remove(force=True)
        except Exception:  # best effort: the result is what matters
            pass
    if code != 0 or progress.result is None:
        print(f"warmup-cache: the seed failed (exit {code}) at stage {progress.stage_name}; last log lines:",
              file=sys.stderr)
        for line in progress.tail[-15:]:
            print("  " + line, file=sys.stderr)
        return code or 1
    print(summary(progress.result), file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make warmup-cache", description=__doc__.splitlines()[0])
    p.add_argument("--image", required=True, help="the appliance image (turingbox:VERSION)")
    # environ: host tool: the Docker volume name (documented in test_settings_names), not a setting
    p.add_argument("--volume", default=envs.cache_volume(DEFAULT_VOLUME),
                   help=f"named cache volume (default {DEFAULT_VOLUME}, env TURINGBOX_CACHE_VOLUME)")
    p.add_argument("extra", nargs="*", help="extra arguments for `turingbox warmup --seed-only`")
    a = p.parse_args(argv)
    try:
        import docker
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        print(f"warmup-cache: cannot reach the Docker engine ({exc.__class__.__name__}: {exc}).", file=sys.stderr)
        return 2
    try:
        client.images.get(a.image)
    except Exception:
        print(f"warmup-cache: image {a.image} is not present here; build it with `make image`.", file=sys.stderr)
        return 2
    # environ: host tool: the host's TURINGBOX_* go raw into the warmup container, which resolves them
    return run(client, a.image, a.volume, envs.process_environment(), a.extra)


if __name__ == "__main__":
    raise SystemExit(main())
