"""One GPU as NVML reports it (or an inventory file shaped like NVML's answers): the record the inventory lists,
visibility filters and the planner plans on."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from turingbox.errors import UsageError

INVENTORY_FIELDS = ("index", "uuid", "name", "compute_capability", "memory_total_mib",
                    "memory_free_mib", "pci_bus_id")
_CC = re.compile(r"^(\d+)\.(\d+)$")


@dataclass(frozen=True)
class Gpu:
    index: int                 # NVML index (PCI bus order), as this process sees it
    uuid: str                  # "GPU-xxxxxxxx-xxxx-..."
    name: str                  # "NVIDIA GeForce RTX 2080 Ti"
    compute_capability: str    # "7.5"
    memory_total_mib: int
    memory_free_mib: int
    pci_bus_id: str            # "00000000:01:00.0"

    @property
    def cc(self) -> tuple[int, int]:
        m = _CC.match(self.compute_capability)
        return (int(m.group(1)), int(m.group(2))) if m else (0, 0)

    @property
    def sm(self) -> int:
        major, minor = self.cc
        return major * 10 + minor

    @property
    def arch(self) -> str:
        return f"sm_{self.sm}"

    @property
    def kind(self) -> tuple[str, str, int]:
        """GPUs of one kind may share a TP group: same name, architecture and memory size."""
        return (self.name, self.compute_capability, self.memory_total_mib)

    def describe(self) -> str:
        return f"{self.name} ({self.arch}, {self.memory_total_mib} MiB)"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pci_sort_key(gpu: Gpu) -> tuple:
    """CUDA_DEVICE_ORDER=PCI_BUS_ID order: domain, bus, device, function (hex), then NVML index."""
    parts = re.split(r"[:.]", gpu.pci_bus_id.lower())
    try:
        return (tuple(int(p, 16) for p in parts), gpu.index)
    except ValueError:
        return ((), gpu.index)


def gpu_from_dict(obj: Any, where: str) -> Gpu:
    """Validate one inventory entry; bad input -> UsageError naming the file and field."""
    if not isinstance(obj, dict):
        raise UsageError(f"{where} is not an object with the inventory fields {', '.join(INVENTORY_FIELDS)}.")
    missing = [k for k in INVENTORY_FIELDS if k not in obj]
    if missing:
        raise UsageError(f"{where} lacks {', '.join(missing)}.")
    try:
        index = int(obj["index"])
        total = int(obj["memory_total_mib"])
        free = int(obj["memory_free_mib"])
    except (TypeError, ValueError):
        raise UsageError(f"{where} has a non-integer index or memory field.") from None
    cc = str(obj["compute_capability"]).strip()
    if not _CC.match(cc):
        raise UsageError(f"{where} has compute_capability {obj['compute_capability']!r}; expected e.g. \"7.5\".")
    if index < 0 or total <= 0 or free < 0 or free > total:
        raise UsageError(f"{where} has impossible values (index {index}, memory_total_mib {total}, "
                         f"memory_free_mib {free}).")
    uuid = str(obj["uuid"]).strip()
    if not uuid:
        raise UsageError(f"{where} has an empty uuid.")
    return Gpu(index=index, uuid=uuid, name=str(obj["name"]).strip(), compute_capability=cc,
               memory_total_mib=total, memory_free_mib=free, pci_bus_id=str(obj["pci_bus_id"]).strip())
