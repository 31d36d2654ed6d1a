"""A stand-in for the ``pynvml`` module: same function names, constants and error class, driven by a table.

No GPU runs on the development machine, so the NVML collector's logic is tested against this object; the
constants are taken from the real pynvml so a renamed or renumbered constant breaks the tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    bus_id: str = "00000000:18:00.0"
    util: int = 87
    mem_util: int = 40
    used: int = 60 * 2**30
    free: int = 20 * 2**30
    temp: int = 61
    power_mw: int = 550_000
    sm_clock: int = 1980
    mem_clock: int = 2619
    throttle: int = 0
    sbe: int = 3
    dbe: int = 0
    remap: tuple[int, int, int, int] | None = (2, 0, 0, 0)
    retired: dict[int, list[int]] = field(default_factory=dict)
    gen: int = 5
    max_gen: int = 5
    width: int = 16
    max_width: int = 16
    replay: int = 0
    nvlinks: list[int] = field(default_factory=lambda: [1] * 18)
    # Each link's remote end (PCI bus id, NVML_NVLINK_DEVICE_TYPE_*); empty: the driver cannot say.
    nvlink_remote: list[tuple[str, int]] = field(default_factory=list)
    uuid: str = "GPU-5a1f0c2e-1d2b-4b8e-9f00-000000000000"
    name: str = "NVIDIA H100 80GB HBM3"
    nvlink_errors: int = 0
    recovery_action: int | None = 0
    unsupported: set[str] = field(default_factory=set)


class FakeNvml:
    """The subset of pynvml the collector calls, with the real constants."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu] | None = None, init_error: int | None = None) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.init_error = init_error
        self.calls: list[str] = []
        self.shutdown = False
        for name in dir(pynvml):
            if name.startswith("NVML_") and isinstance(getattr(pynvml, name), int):
                setattr(self, name, getattr(pynvml, name))

    def _gpu(self, handle: int, function: str) -> FakeGpu:
        self.calls.append(function)
        gpu = self.gpus[handle]
        if function in gpu.unsupported:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self._gpu(h, "nvmlDeviceGetPciInfo").bus_id.encode())

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        g = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=g.util, memory=g.mem_util)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        g = self._gpu(h, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(used=g.used, free=g.free, total=g.used + g.free)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu(h, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetClockInfo")
        return {pynvml.NVML_CLOCK_SM: g.sm_clock, pynvml.NVML_CLOCK_MEM: g.mem_clock}[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons").throttle

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetTotalEccErrors")
        assert counter == pynvml.NVML_VOLATILE_ECC
        return g.sbe if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else g.dbe

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        g = self._gpu(h, "nvmlDeviceGetRemappedRows")
        if g.remap is None:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g.remap

    def nvmlDeviceGetRetiredPages(self, h: int, cause: int) -> list[int]:
        return self._gpu(h, "nvmlDeviceGetRetiredPages").retired.get(cause, [])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        self._gpu(h, "nvmlDeviceGetRetiredPagesPendingStatus")
        return pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkGeneration").gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkGeneration").max_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkWidth").width

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkWidth").max_width

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetPcieReplayCounter").replay

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetNvLinkState")
        if link >= len(g.nvlinks):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g.nvlinks[link]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        g = self._gpu(h, "nvmlDeviceGetNvLinkRemotePciInfo")
        if link >= len(g.nvlink_remote):
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(busId=g.nvlink_remote[link][0].encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: int, link: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetNvLinkRemoteDeviceType")
        if link >= len(g.nvlink_remote):
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g.nvlink_remote[link][1]

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._gpu(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, h: int) -> str:
        return self._gpu(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetNvLinkErrorCounter")
        return g.nvlink_errors if counter == pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT else 0

    def nvmlDeviceGetFieldValues(self, h: int, field_ids: list[int]) -> list[Any]:
        g = self._gpu(h, "nvmlDeviceGetFieldValues")
        assert field_ids == [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
        if g.recovery_action is None:
            return [SimpleNamespace(nvmlReturn=pynvml.NVML_ERROR_NOT_SUPPORTED, value=SimpleNamespace(uiVal=0))]
        return [SimpleNamespace(nvmlReturn=pynvml.NVML_SUCCESS, value=SimpleNamespace(uiVal=g.recovery_action))]
