"""Inventory: the DESIGN inventory JSON and NVML (through a fake nvml module: no GPU here)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from turingbox.errors import PlanError, UsageError
from turingbox.gpus.inventory import Gpu, JsonSource, NvmlSource, gpu_from_dict, read_inventory

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "gpus"
FIELDS = {"index", "uuid", "name", "compute_capability", "memory_total_mib", "memory_free_mib", "pci_bus_id"}


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_fixtures_are_shaped_like_the_design_inventory(path):
    data = json.loads(path.read_text())
    assert isinstance(data, list)
    for entry in data:
        assert set(entry) == FIELDS
        assert entry["uuid"].startswith("GPU-") and entry["memory_free_mib"] <= entry["memory_total_mib"]
    if not data:      # an empty inventory names the file instead of planning "no GPU"
        with pytest.raises(PlanError, match="lists no GPU"):
            JsonSource(str(path)).list_gpus()
        return
    gpus = JsonSource(str(path)).list_gpus()
    assert [g.to_dict() for g in gpus] == data


def test_empty_gpus_object_names_the_file(tmp_path):
    f = tmp_path / "gpus.json"
    f.write_text('{"gpus": []}')
    with pytest.raises(PlanError) as info:
        JsonSource(str(f)).list_gpus()
    text = str(info.value)
    assert "--gpus-json/TURINGBOX_GPUS_JSON" in text and str(f) in text and "\n" not in text


def test_json_inventory_is_sorted_in_pci_order(tmp_path):
    entries = json.loads((FIXTURES / "4x2080ti-22g.json").read_text())
    entries[0]["pci_bus_id"], entries[3]["pci_bus_id"] = entries[3]["pci_bus_id"], entries[0]["pci_bus_id"]
    f = tmp_path / "gpus.json"
    f.write_text(json.dumps(list(reversed(entries))))
    inv = read_inventory(str(f), {})
    assert [g.pci_bus_id for g in inv.gpus] == sorted(g.pci_bus_id for g in inv.gpus)
    assert inv.gpus[0].index == 3 and inv.source == f"json:{f}"


def test_gpu_properties():
    g = JsonSource(str(FIXTURES / "1xh200.json")).list_gpus()[0]
    assert (g.sm, g.arch, g.cc) == (90, "sm_90", (9, 0))
    assert g.kind == ("NVIDIA H200", "9.0", 143771)


@pytest.mark.parametrize("content,words", [
    ("{not json", ["not valid JSON"]),
    ('{"gpus": 3}', ["JSON list"]),
    ('[{"index": 0}]', ["lacks", "uuid"]),
    ('[{"index": 0, "uuid": "GPU-1", "name": "x", "compute_capability": "seven", "memory_total_mib": 1,'
     ' "memory_free_mib": 1, "pci_bus_id": "0"}]', ["compute_capability"]),
    ('[{"index": 0, "uuid": "GPU-1", "name": "x", "compute_capability": "7.5", "memory_total_mib": 10,'
     ' "memory_free_mib": 20, "pci_bus_id": "0"}]', ["impossible"]),
])
def test_bad_inventory_files_are_usage_errors(tmp_path, content, words):
    f = tmp_path / "gpus.json"
    f.write_text(content)
    with pytest.raises(UsageError) as info:
        read_inventory(str(f), {})
    for w in words:
        assert w in str(info.value)


def test_duplicate_gpus_refused(tmp_path):
    entries = json.loads((FIXTURES / "2x2080ti-22g.json").read_text())
    entries[1]["uuid"] = entries[0]["uuid"]
    f = tmp_path / "gpus.json"
    f.write_text(json.dumps(entries))
    with pytest.raises(UsageError, match="twice"):
        read_inventory(str(f), {})


def test_missing_inventory_file(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        read_inventory(str(tmp_path / "nope.json"), {})


class FakeNvml:
    """Stands in for pynvml (hardware we lack): same function names and return shapes."""

    def __init__(self, devices, fail_init=None):
        self.devices, self.fail_init, self.shutdown = devices, fail_init, False

    def nvmlInit(self):
        if self.fail_init:
            raise self.fail_init

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.devices[i]

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return h["cc"]

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=h["total"], free=h["free"], used=h["total"] - h["free"])

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=h["bus"])

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]

    def nvmlDeviceGetName(self, h):
        return h["name"]


def test_nvml_source_reads_every_field():
    fake = FakeNvml([
        {"cc": (7, 5), "total": 22528 << 20, "free": 22300 << 20, "bus": b"00000000:02:00.0",
         "uuid": "GPU-bbbb", "name": b"NVIDIA GeForce RTX 2080 Ti"},
        {"cc": (7, 5), "total": 22528 << 20, "free": 22000 << 20, "bus": "00000000:01:00.0",
         "uuid": "GPU-aaaa", "name": "NVIDIA GeForce RTX 2080 Ti"},
    ])
    inv = read_inventory(None, {}, source=NvmlSource(fake))
    assert fake.shutdown
    assert [g.uuid for g in inv.gpus] == ["GPU-aaaa", "GPU-bbbb"]          # PCI order
    assert inv.gpus[1] == Gpu(index=0, uuid="GPU-bbbb", name="NVIDIA GeForce RTX 2080 Ti",
                              compute_capability="7.5", memory_total_mib=22528, memory_free_mib=22300,
                              pci_bus_id="00000000:02:00.0")


def test_nvml_without_driver_is_one_sentence():
    fake = FakeNvml([], fail_init=RuntimeError("Driver Not Loaded"))
    with pytest.raises(PlanError) as info:
        NvmlSource(fake).list_gpus()
    assert "Driver Not Loaded" in str(info.value) and "--gpus-json" in str(info.value)


def test_gpu_from_dict_rejects_non_objects():
    with pytest.raises(UsageError):
        gpu_from_dict([1, 2], "entry 0")


class FakeNvmlTelemetry(FakeNvml):
    """pynvml's live-telemetry calls too (same names and return shapes)."""
    NVML_TEMPERATURE_GPU = 0

    def nvmlDeviceGetUtilizationRates(self, h):
        if h.get("broken"):
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return SimpleNamespace(gpu=h["util"], memory=0)

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return h["temp"]

    def nvmlDeviceGetPowerUsage(self, h):
        return h["mw"]


def test_telemetry_samples_the_plans_gpus_and_skips_a_broken_one():
    from turingbox.gpus.inventory import NvmlTelemetry
    dev = {"cc": (7, 5), "total": 22528 << 20, "free": 2000 << 20, "bus": "x", "name": "x", "util": 87, "temp": 71,
           "mw": 251_500}
    fake = FakeNvmlTelemetry([{**dev, "uuid": b"GPU-aaaa"}, {**dev, "uuid": "GPU-bbbb"},
                              {**dev, "uuid": "GPU-cccc", "broken": True}])
    t = NvmlTelemetry(fake)
    all_ = t.sample()
    assert [g.uuid for g in all_] == ["GPU-aaaa", "GPU-bbbb"]             # the lost GPU does not hide the others
    g = t.sample(["GPU-bbbb"])
    assert [(x.index, x.uuid) for x in g] == [(1, "GPU-bbbb")]
    assert (g[0].utilization_ratio, g[0].temperature_celsius, g[0].power_watts) == (0.87, 71.0, 251.5)
    assert g[0].memory_used_bytes == float((22528 - 2000) << 20) and g[0].memory_total_bytes == float(22528 << 20)


def test_telemetry_without_nvml_is_empty_not_an_error():
    from turingbox.gpus.inventory import NvmlTelemetry
    t = NvmlTelemetry(FakeNvml([], fail_init=RuntimeError("Driver Not Loaded")))
    assert t.sample() == [] and t.sample(["GPU-x"]) == []


def test_metrics_report_the_telemetry_samples():
    from prometheus_client import CollectorRegistry, generate_latest
    from turingbox.gpus.inventory import NvmlTelemetry
    from turingbox.serve.metrics import _GpuCollector
    dev = {"cc": (7, 5), "total": 1 << 30, "free": 1 << 29, "bus": "x", "name": "x", "util": 50, "temp": 60, "mw": 100_000}
    reg = CollectorRegistry()
    reg.register(_GpuCollector(lambda: ["GPU-aaaa"], NvmlTelemetry(FakeNvmlTelemetry([{**dev, "uuid": "GPU-aaaa"},
                                                                                     {**dev, "uuid": "GPU-zzzz"}]))))
    page = generate_latest(reg).decode()
    assert 'turingbox_gpu_utilization_ratio{index="0",uuid="GPU-aaaa"} 0.5' in page
    assert 'turingbox_gpu_power_watts{index="0",uuid="GPU-aaaa"} 100.0' in page and "GPU-zzzz" not in page
    empty = CollectorRegistry()
    empty.register(_GpuCollector(lambda: [], NvmlTelemetry(FakeNvml([], fail_init=RuntimeError("no driver")))))
    assert "turingbox_gpu_" not in generate_latest(empty).decode()
