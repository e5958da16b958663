"""GPU inventory: what NVML reports (or a JSON file shaped like it), with visibility applied.

The appliance talks to NVML here only: `NvmlSource` for the inventory the planner reads, `NvmlTelemetry`
for the live samples /metrics reports. Everything else works on `Gpu` / `GpuSample` values, so the planner
and its tests run on machines without a GPU (`--gpus-json FILE`). (The plugin, installable alone, has its
own read for `turingbox-plugin doctor`.)
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from turingbox.config import envs
from turingbox.errors import PlanError, UsageError
from turingbox.gpus.device import Gpu, gpu_from_dict, pci_sort_key
from turingbox.gpus.visibility import apply_visibility

log = logging.getLogger("turingbox.gpus")


class GpuSource(Protocol):
    description: str

    def list_gpus(self) -> list[Gpu]: ...


class JsonSource:
    """The DESIGN inventory JSON: a list of GPU objects (or {"gpus": [...]})."""

    def __init__(self, path: str):
        self.path = path
        self.description = f"json:{path}"

    def list_gpus(self) -> list[Gpu]:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            raise UsageError(f"--gpus-json file {self.path} does not exist.") from None
        except (OSError, ValueError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UsageError(f"--gpus-json file {self.path} is not valid JSON ({reason}).") from None
        if isinstance(data, dict) and isinstance(data.get("gpus"), list):
            data = data["gpus"]
        if not isinstance(data, list):
            raise UsageError(f"--gpus-json file {self.path} must hold a JSON list of GPUs.")
        if not data:
            # An empty file is a simulation mistake, not "this machine has no GPU": name the file.
            raise PlanError(f"--gpus-json/TURINGBOX_GPUS_JSON file {self.path} lists no GPU (an empty list); "
                            "add inventory entries to it, or unset it to read the GPUs through NVML.")
        gpus = [gpu_from_dict(item, f"--gpus-json {self.path} entry {i}") for i, item in enumerate(data)]
        _check_unique(gpus, f"--gpus-json file {self.path}")
        return gpus


class NvmlSource:
    """The real GPUs, through nvidia-ml-py. Initialises NVML only (never CUDA)."""

    description = "nvml"

    def __init__(self, nvml: Any = None):
        self._nvml = nvml

    def list_gpus(self) -> list[Gpu]:
        nvml = self._nvml
        if nvml is None:
            try:
                import pynvml as nvml  # nvidia-ml-py
            except ImportError:
                raise PlanError("nvidia-ml-py is not installed, so no GPU can be found; "
                                "install it or pass --gpus-json FILE.") from None
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            raise PlanError(f"no NVIDIA GPU found: NVML did not start ({_nvml_reason(exc)}); "
                            "run with the NVIDIA runtime (--gpus all) or pass --gpus-json FILE.") from None
        try:
            gpus = []
            for i in range(nvml.nvmlDeviceGetCount()):
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                major, minor = nvml.nvmlDeviceGetCudaComputeCapability(h)
                mem = nvml.nvmlDeviceGetMemoryInfo(h)
                pci = nvml.nvmlDeviceGetPciInfo(h)
                bus_id = pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)
                gpus.append(Gpu(
                    index=i,
                    uuid=_text(nvml.nvmlDeviceGetUUID(h)),
                    name=_text(nvml.nvmlDeviceGetName(h)),
                    compute_capability=f"{major}.{minor}",
                    memory_total_mib=int(mem.total) // (1 << 20),
                    memory_free_mib=int(mem.free) // (1 << 20),
                    pci_bus_id=bus_id,
                ))
            return gpus
        except Exception as exc:
            raise PlanError(f"reading the GPUs through NVML failed ({_nvml_reason(exc)}).") from None
        finally:
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass


@dataclass(frozen=True)
class GpuSample:
    """One GPU's live telemetry, as /metrics reports it."""
    index: int
    uuid: str
    memory_used_bytes: float
    memory_total_bytes: float
    utilization_ratio: float
    temperature_celsius: float
    power_watts: float


class NvmlTelemetry:
    """Live telemetry through NVML for the sidecar's /metrics: NVML is started once and kept (a scrape every
    few seconds); without NVML (no driver, CPU-only) `sample` returns [] and says so once in the log."""

    def __init__(self, nvml: Any = None):
        self._nvml = nvml
        self._started = False
        self._unavailable = False

    def _start(self) -> Any:
        if not self._started and not self._unavailable:
            try:
                if self._nvml is None:
                    import pynvml  # nvidia-ml-py
                    self._nvml = pynvml
                self._nvml.nvmlInit()
                self._started = True
            except Exception as exc:
                self._unavailable = True
                log.info("GPU telemetry off: NVML is not available (%s)", _nvml_reason(exc))
        return self._nvml if self._started else None

    def sample(self, uuids: Sequence[str] = ()) -> list[GpuSample]:
        """The GPUs whose UUID is in `uuids` (all when empty); a device that fails a read is left out."""
        nv = self._start()
        if nv is None:
            return []
        wanted = set(uuids)
        try:
            count = nv.nvmlDeviceGetCount()
        except Exception:
            return []
        out = []
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(nv.nvmlDeviceGetUUID(h))
                if wanted and uuid not in wanted:
                    continue
                m = nv.nvmlDeviceGetMemoryInfo(h)
                out.append(GpuSample(
                    index=i, uuid=uuid, memory_used_bytes=float(m.used), memory_total_bytes=float(m.total),
                    utilization_ratio=nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
                    temperature_celsius=float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                    power_watts=nv.nvmlDeviceGetPowerUsage(h) / 1000.0))
            except Exception:       # one odd device (or a field it lacks) must not hide the others
                continue
        return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _check_unique(gpus: Sequence[Gpu], where: str) -> None:
    seen_idx, seen_uuid = set(), set()
    for g in gpus:
        if g.index in seen_idx:
            raise UsageError(f"{where} lists GPU index {g.index} twice.")
        if g.uuid in seen_uuid:
            raise UsageError(f"{where} lists GPU {g.uuid} twice.")
        seen_idx.add(g.index)
        seen_uuid.add(g.uuid)


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[Gpu, ...]                 # visible GPUs in CUDA (PCI bus) order
    source: str                           # "nvml" or "json:PATH"
    all_gpus: tuple[Gpu, ...] = ()        # everything the source reported, before visibility
    hidden: tuple[dict, ...] = field(default=())   # [{uuid, index, reason}] hidden by visibility vars
    visibility: str = ""                  # one line: which variables filtered what

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "visibility": self.visibility,
                "gpus": [g.to_dict() for g in self.gpus], "hidden": list(self.hidden)}


def read_inventory(gpus_json: str | None, env: Mapping[str, str] | None = None,
                   source: GpuSource | None = None) -> Inventory:
    """The visible GPUs in CUDA order: NVML (or the JSON file), then NVIDIA_/CUDA_VISIBLE_DEVICES."""
    # NVIDIA_/CUDA_VISIBLE_DEVICES: the container runtime's and CUDA's variables, not settings
    env = envs.gpu_visibility() if env is None else env
    if source is None:
        source = JsonSource(gpus_json) if gpus_json else NvmlSource()
    reported = sorted(source.list_gpus(), key=pci_sort_key)
    visible, hidden, note = apply_visibility(reported, env)
    return Inventory(gpus=tuple(visible), source=source.description, all_gpus=tuple(reported),
                     hidden=tuple(hidden), visibility=note)
