"""GPU collector through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Metric names follow dcgm-exporter (``DCGM_FI_DEV_*``) so that rules and dashboards read the same series
whether a node runs dcgm-exporter, this collector, or the simulator; units are DCGM's (MiB, W, MHz, C).
A few facts dcgm-exporter has no field for get ``vigil_gpu_*`` names (NVLink links down, recovery action).

Every call is the real pynvml call. The module object is a constructor argument (``nvml=``) so tests can
inject a fake that implements the same functions; on a machine with no NVIDIA driver ``nvmlInit`` fails with
``NVMLError_LibraryNotFound`` / ``DriverNotLoaded`` and the collector reports "no GPU" instead of failing.
Fields a GPU does not support (``NVML_ERROR_NOT_SUPPORTED``: ECC on consumer boards, NVLink on PCIe cards,
row remapping before Ampere) are skipped silently; other per-field errors are counted.

The collector records and judges nothing: a narrow PCIe link or a failed row remap is a metric that the rules
judge (``vigil.detect.rules``); the one event it raises is a change of the driver's recovery action, decoded to
NVIDIA's name, whose level the fault catalogue gives.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from types import ModuleType
from typing import Any

from vigil.model import Event, Gpu, VigilInputError, gpu_id, node_id
from vigil.sources.collect.base import Collection, Point, Source, default_node_name
from vigil.sources.collect.gpu_topology import parse_nvidia_smi_topo, read_nvidia_smi_topo

# NVML's recovery action enum (nvmlDeviceGetFieldValues NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), decoded to the
# names of NVIDIA's error-recovery-and-response-flags page; what an action means for the GPU is judged in detect.
RECOVERY_ACTIONS = {0: "NONE", 1: "GPU_RESET", 2: "NODE_REBOOT", 3: "DRAIN_P2P", 4: "DRAIN_AND_RESET"}

NVLINK_ERROR_METRICS = {
    "NVML_NVLINK_ERROR_DL_CRC_FLIT": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "NVML_NVLINK_ERROR_DL_CRC_DATA": "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "NVML_NVLINK_ERROR_DL_REPLAY": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "NVML_NVLINK_ERROR_DL_RECOVERY": "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
}


def _load_pynvml() -> ModuleType:
    import pynvml

    return pynvml


class NvmlCollector(Source):
    """Per-GPU utilization, memory, temperature, power, clocks, ECC, retired pages / row remapping, PCIe link
    generation and width, NVLink state and errors, throttle reasons and the recovery action field."""

    name = "nvml"
    kind = "gpu"

    def __init__(self, node: str | None = None, nvml: Any = None, health_every: int = 6,
                 topo_reader: Callable[[], str | None] = read_nvidia_smi_topo) -> None:
        super().__init__()
        # Health counters (ECC, row remapping / retired pages, per-link NVLink errors) change rarely and cost
        # most of the NVML calls (5 per NVLink link, 18 links on an H100): they are read on every
        # ``health_every``-th collect and their last values repeated in between - 60 s at the 10 s default.
        self.health_every = max(1, health_every)
        self._reads = 0
        self._health: dict[int, list[Point]] = {}
        self._links: dict[int, int] = {}
        self.node = node or default_node_name()
        self._nvml: Any = nvml
        self._initialised = False
        self._handles: list[Any] = []
        self.available = False
        self.status = "not started"
        self.pci_to_index: dict[str, int] = {}
        # The node's GPUs as the inventory registers them (index, UUID, PCI bus id, model, NVLink peers).
        self.gpus: dict[int, Gpu] = {}
        self._topo_reader = topo_reader
        # Last recovery action per GPU, so an event is raised on a change, not on every scrape.
        self._recovery: dict[int, int] = {}

    # ---------------------------------------------------------------- setup

    def _init(self) -> bool:
        if self._initialised:
            return self.available
        self._initialised = True
        if self._nvml is None:
            try:
                self._nvml = _load_pynvml()
            except ImportError:
                self.status = "no GPU: nvidia-ml-py is not installed"
                return False
        nv = self._nvml
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
            self._handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nv.NVMLError as err:
            self.status = f"no GPU: NVML unavailable ({err})"
            return False
        buses: dict[int, str] = {}
        for index, handle in enumerate(self._handles):
            bus = self._call(handle, "nvmlDeviceGetPciInfo")
            if bus is not None:
                buses[index] = _text(bus.busId)
                self.pci_to_index[normalise_pci_bus(buses[index])] = index
        peers = self._nvlink_peers()
        for index, handle in enumerate(self._handles):
            uuid, model = self._call(handle, "nvmlDeviceGetUUID"), self._call(handle, "nvmlDeviceGetName")
            self.gpus[index] = Gpu(node=self.node, index=index, uuid=_text(uuid or ""), model=_text(model or ""),
                                   pci_bus_id=buses.get(index, ""), nvlink_peers=peers.get(index, []))
        self.available = True
        self.status = f"{count} GPU(s) through NVML"
        return True

    def _nvlink_peers(self) -> dict[int, list[int]]:
        """Each GPU's NVLink peers from the remote end of every active link: a GPU of this node (by PCI bus id)
        is a peer; an NVSwitch makes every GPU cabled to it a peer. Where NVML cannot name the remote ends,
        ``nvidia-smi topo -m`` tells the same from its NV# cells."""
        nv = self._nvml
        peers: dict[int, set[int]] = {index: set() for index in range(len(self._handles))}
        switches: dict[str, set[int]] = defaultdict(set)
        remote_known = False
        for index, handle in enumerate(self._handles):
            for link in range(nv.NVML_NVLINK_MAX_LINKS):
                try:
                    if nv.nvmlDeviceGetNvLinkState(handle, link) != nv.NVML_FEATURE_ENABLED:
                        continue
                except nv.NVMLError:
                    break  # links past the GPU's last one: the end of the list
                remote = self._call(handle, "nvmlDeviceGetNvLinkRemotePciInfo", link)
                if remote is None:
                    continue
                remote_known = True
                bus = normalise_pci_bus(_text(remote.busId))
                kind = self._call(handle, "nvmlDeviceGetNvLinkRemoteDeviceType", link)
                peer = self.pci_to_index.get(bus)
                if peer is not None and kind in (None, nv.NVML_NVLINK_DEVICE_TYPE_GPU):
                    peers[index].add(peer)
                elif kind in (None, nv.NVML_NVLINK_DEVICE_TYPE_SWITCH):
                    switches[bus].add(index)
        for members in switches.values():
            for index in members:
                peers[index] |= members
        if not remote_known:
            return self._nvlink_peers_from_topo()
        return {index: sorted(found - {index}) for index, found in peers.items()}

    def _nvlink_peers_from_topo(self) -> dict[int, list[int]]:
        text = self._topo_reader()
        if text is None:
            return {}
        try:
            return parse_nvidia_smi_topo(text).nvlink_peers()
        except VigilInputError as err:
            self.problems.report("nvidia-smi topo -m", str(err))
            return {}

    def close(self) -> None:
        if self.available:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as err:
                self.problems.report("shutdown", str(err))
        self.available = False
        self._initialised = False

    def _call(self, handle: Any, function: str, *args: Any) -> Any:
        """One NVML query; None when the GPU does not support it or it failed (failures are counted)."""
        nv = self._nvml
        try:
            return getattr(nv, function)(handle, *args)
        except nv.NVMLError as err:
            if getattr(err, "value", None) != nv.NVML_ERROR_NOT_SUPPORTED:
                self.problems.report(function, str(err))
            return None
        except AttributeError:
            # An older nvidia-ml-py without this function: the field is simply not collected.
            self.problems.report(function, "not in this nvidia-ml-py version")
            return None

    # ---------------------------------------------------------------- reading

    def collect(self, now: float) -> Collection:
        out = Collection()
        if not self._init():
            out.status = self.status
            out.add("vigil_node_gpus", node_id(self.node), 0)
            return out
        out.status = self.status
        out.add("vigil_node_gpus", node_id(self.node), len(self._handles))
        fresh = self._reads % self.health_every == 0
        self._reads += 1
        for index, handle in enumerate(self._handles):
            self._collect_gpu(out, now, index, handle, fresh)
        return out

    def _collect_gpu(self, out: Collection, now: float, index: int, handle: Any, fresh: bool) -> None:
        nv = self._nvml
        entity = gpu_id(self.node, index)
        util = self._call(handle, "nvmlDeviceGetUtilizationRates")
        if util is not None:
            out.add("DCGM_FI_DEV_GPU_UTIL", entity, util.gpu)
            out.add("DCGM_FI_DEV_MEM_COPY_UTIL", entity, util.memory)
        mem = self._call(handle, "nvmlDeviceGetMemoryInfo")
        if mem is not None:
            out.add("DCGM_FI_DEV_FB_USED", entity, mem.used / 2**20)
            out.add("DCGM_FI_DEV_FB_FREE", entity, mem.free / 2**20)
        out.add(
            "DCGM_FI_DEV_GPU_TEMP",
            entity,
            self._call(handle, "nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU),
        )
        power_mw = self._call(handle, "nvmlDeviceGetPowerUsage")
        out.add("DCGM_FI_DEV_POWER_USAGE", entity, None if power_mw is None else power_mw / 1000.0)
        out.add("DCGM_FI_DEV_SM_CLOCK", entity, self._call(handle, "nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM))
        out.add("DCGM_FI_DEV_MEM_CLOCK", entity, self._call(handle, "nvmlDeviceGetClockInfo", nv.NVML_CLOCK_MEM))
        out.add(
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
            entity,
            self._call(handle, "nvmlDeviceGetCurrentClocksEventReasons"),
        )
        self._collect_pcie(out, entity, handle)
        self._collect_nvlink_state(out, index, entity, handle)
        self._collect_recovery_action(out, now, index, entity, handle)
        if fresh:
            health = Collection()
            self._collect_ecc(health, entity, handle)
            self._collect_memory_health(health, entity, handle)
            self._collect_nvlink_errors(health, index, entity, handle)
            self._health[index] = health.points
            out.events.extend(health.events)
        out.points.extend(self._health.get(index, []))

    def _collect_ecc(self, out: Collection, entity: str, handle: Any) -> None:
        nv = self._nvml
        for metric, error_type in (
            ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            out.add(metric, entity, self._call(handle, "nvmlDeviceGetTotalEccErrors", error_type, nv.NVML_VOLATILE_ECC))

    def _collect_memory_health(self, out: Collection, entity: str, handle: Any) -> None:
        nv = self._nvml
        remap = self._call(handle, "nvmlDeviceGetRemappedRows")
        if remap is not None:
            corrected, uncorrected, pending, failure = remap
            out.add("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", entity, corrected)
            out.add("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", entity, uncorrected)
            out.add("DCGM_FI_DEV_ROW_REMAP_PENDING", entity, pending)
            out.add("DCGM_FI_DEV_ROW_REMAP_FAILURE", entity, failure)
            return
        # Pre-Ampere GPUs retire pages instead of remapping rows.
        sbe = self._call(
            handle, "nvmlDeviceGetRetiredPages", nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        )
        dbe = self._call(handle, "nvmlDeviceGetRetiredPages", nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        out.add("DCGM_FI_DEV_RETIRED_SBE", entity, None if sbe is None else len(sbe))
        out.add("DCGM_FI_DEV_RETIRED_DBE", entity, None if dbe is None else len(dbe))
        pending = self._call(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
        out.add(
            "DCGM_FI_DEV_RETIRED_PENDING",
            entity,
            None if pending is None else int(pending == nv.NVML_FEATURE_ENABLED),
        )

    def _collect_pcie(self, out: Collection, entity: str, handle: Any) -> None:
        gen = self._call(handle, "nvmlDeviceGetCurrPcieLinkGeneration")
        max_gen = self._call(handle, "nvmlDeviceGetMaxPcieLinkGeneration")
        width = self._call(handle, "nvmlDeviceGetCurrPcieLinkWidth")
        max_width = self._call(handle, "nvmlDeviceGetMaxPcieLinkWidth")
        out.add("DCGM_FI_DEV_PCIE_LINK_GEN", entity, gen)
        out.add("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", entity, max_gen)
        # Current and maximum width both go out, so the rules can compare a GPU with its own slot: width is the
        # downgrade signal (a bad riser, cable or seating), generation is not (idle GPUs lower it to save power).
        out.add("DCGM_FI_DEV_PCIE_LINK_WIDTH", entity, width)
        out.add("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", entity, max_width)
        out.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", entity, self._call(handle, "nvmlDeviceGetPcieReplayCounter"))

    def _collect_nvlink_state(self, out: Collection, index: int, entity: str, handle: Any) -> None:
        nv = self._nvml
        links_up = links_down = 0
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                state = nv.nvmlDeviceGetNvLinkState(handle, link)
            except nv.NVMLError:
                # Links past the GPU's last one answer NOT_SUPPORTED / INVALID_ARGUMENT: the end of the list.
                break
            if state == nv.NVML_FEATURE_ENABLED:
                links_up += 1
            else:
                links_down += 1
        self._links[index] = links_up + links_down
        if links_up + links_down == 0:
            return
        out.add("vigil_gpu_nvlink_links_up", entity, links_up)
        out.add("vigil_gpu_nvlink_links_down", entity, links_down)

    def _collect_nvlink_errors(self, out: Collection, index: int, entity: str, handle: Any) -> None:
        nv = self._nvml
        links = self._links.get(index, 0)
        if links == 0:
            return
        errors = dict.fromkeys(NVLINK_ERROR_METRICS.values(), 0)
        for link in range(links):
            for counter, metric in NVLINK_ERROR_METRICS.items():
                value = self._call(handle, "nvmlDeviceGetNvLinkErrorCounter", link, getattr(nv, counter))
                errors[metric] += value or 0
        for metric, total in errors.items():
            out.add(metric, entity, total)

    def _collect_recovery_action(self, out: Collection, now: float, index: int, entity: str, handle: Any) -> None:
        nv = self._nvml
        field_id = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field_id is None:
            return
        values = self._call(handle, "nvmlDeviceGetFieldValues", [field_id])
        if not values or values[0].nvmlReturn != nv.NVML_SUCCESS:
            return
        action = int(values[0].value.uiVal)
        out.add("vigil_gpu_recovery_action", entity, action)
        previous = self._recovery.get(index, 0)
        self._recovery[index] = action
        if action != previous and action != 0:
            name = RECOVERY_ACTIONS.get(action, f"UNKNOWN_{action}")
            out.events.append(
                Event(
                    ts=now,
                    entity=entity,
                    kind="gpu_recovery_action",
                    source="nvml",
                    message=f"driver asks for recovery action {name}",
                    attrs={"action": name, "code": action},
                )
            )


def normalise_pci_bus(bus: str) -> str:
    """``00000000:9B:00.0`` (NVML) and ``0000:9b:00`` (kernel Xid line) -> ``0000:9b:00``."""
    bus = bus.strip().lower()
    if bus.count(":") == 2:
        domain, rest = bus.split(":", 1)
        bus = f"{domain[-4:]}:{rest}"
    return bus.split(".")[0]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
