"""GPU state around a measurement, read through NVML (nvidia-ml-py): clock, temperature, power, throttling.

``read_state(device)`` takes one reading (None on CPU, or where NVML is missing or refuses);
``read_during(device)`` takes it on a thread of its own while the caller goes on to time the samples,
so the worker does not wait for it: on an H100 the screening look fell by 0.2-0.4 ms (10.0 -> 9.8 and
11.0 -> 10.6 ms, old and new side by side; benchmarks/results/throughput.md). ``state_around(before,
after)`` turns the readings taken around a measurement into what its record keeps (``DeviceState``: the
SM clock, temperature, power, whether it was throttled, and the throttle reasons' bit mask). Clock and
power are the reading's taken while the samples run, at the GPU's working clock; temperature is the
higher of the two.
A measurement is flagged throttled when a slowdown reason (power cap, thermal, power brake, hardware
slowdown) was active at either reading, or the driver's power or thermal violation counters grew
in between. The reading before a measurement is the one taken during the last (``ItemRunner``), so the
counters' growth is split between measurements with nothing left out; a slowdown that begins after a
measurement's reading flags the next one, and the drift guard's check after the measurement sees it
where it slows the reference.

NVML numbers GPUs physically and ignores ``CUDA_VISIBLE_DEVICES``, so a torch device is matched to
its NVML handle by UUID, then by PCI bus id.
"""

from __future__ import annotations

import functools
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

# nvmlClocksEventReason* bits that mean the clock was pulled down (not idle, not an app-clock setting).
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # SwPowerCap, HwSlowdown, SwThermal, HwThermal, PowerBrake
_PERF_POLICIES = (0, 1)  # NVML_PERF_POLICY_POWER, NVML_PERF_POLICY_THERMAL

_handles: dict[str, Any] = {}


@dataclass(frozen=True)
class GpuState:
    sm_clock_mhz: float | None
    temperature_c: float | None
    power_w: float | None
    throttle_reasons: int | None
    violation_ns: int | None  # power + thermal violation time since boot


@dataclass(frozen=True)
class DeviceState:
    """The device's state around a measurement, as its record keeps it (module doc)."""

    sm_clock_mhz: float | None
    temperature_c: float | None
    power_w: float | None
    throttled: bool | None
    throttle_reasons: int | None


def read_state(device: str, nvml: Any = None) -> GpuState | None:
    """One reading of ``device``'s state, or None where there is nothing to read."""
    if not device.startswith("cuda"):
        return None
    try:
        nvml = nvml or _nvml()
        handle = _handle(device, nvml)
    except Exception:  # no NVML, no driver, or no matching device: state is simply not recorded
        return None
    if handle is None:
        return None
    return GpuState(
        sm_clock_mhz=_try(lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))),
        temperature_c=_try(lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
        power_w=_try(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
        throttle_reasons=_try(lambda: int(_reasons_fn(nvml)(handle))),
        violation_ns=_try(
            lambda: sum(
                int(nvml.nvmlDeviceGetViolationStatus(handle, p).violationTime) for p in _PERF_POLICIES
            )
        ),
    )


def read_during(device: str) -> Future[GpuState | None]:
    """``read_state(device)``, taken on a thread of its own while the caller measures (module doc): the
    reading, once it is taken. NVML's calls leave the interpreter free while they wait for the driver.
    Nothing to read (a CPU) is answered at once."""
    if not device.startswith("cuda"):
        done: Future[GpuState | None] = Future()
        done.set_result(None)
        return done
    return _reader().submit(read_state, device)


@functools.cache
def _reader() -> ThreadPoolExecutor:
    """The thread ``read_during`` reads on, made at its first use."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunectl-nvml")


def state_around(before: GpuState | None, after: GpuState | None) -> DeviceState | None:
    """The device's state for a measurement bracketed by ``before`` and ``after`` (None if unread)."""
    if before is None and after is None:
        return None
    last = after or before
    assert last is not None
    temps = [s.temperature_c for s in (before, after) if s is not None and s.temperature_c is not None]
    return DeviceState(
        sm_clock_mhz=last.sm_clock_mhz,
        temperature_c=max(temps) if temps else None,
        power_w=last.power_w,
        throttled=is_throttled(before, after),
        throttle_reasons=_reasons_seen(before, after),
    )


def _reasons_seen(before: GpuState | None, after: GpuState | None) -> int | None:
    """NVML's clock event reasons active at either reading (a bit mask), None if neither was read."""
    readings = (before, after)
    reasons = [s.throttle_reasons for s in readings if s is not None and s.throttle_reasons is not None]
    return None if not reasons else reasons[0] | reasons[-1]


def is_throttled(before: GpuState | None, after: GpuState | None) -> bool | None:
    """True if clocks were pulled down around the samples; None if nothing said either way."""
    reasons = [
        s.throttle_reasons for s in (before, after) if s is not None and s.throttle_reasons is not None
    ]
    counters = (
        (before.violation_ns, after.violation_ns)
        if before is not None and after is not None and None not in (before.violation_ns, after.violation_ns)
        else None
    )
    if not reasons and counters is None:
        return None
    grew = counters is not None and counters[1] > counters[0]  # type: ignore[operator]
    return any(r & THROTTLE_MASK for r in reasons) or grew


def _nvml() -> Any:
    import pynvml

    pynvml.nvmlInit()  # idempotent: NVML counts its inits
    return pynvml


def _handle(device: str, nvml: Any) -> Any:
    if device in _handles:
        return _handles[device]
    import torch

    props = torch.cuda.get_device_properties(device)
    handle = None
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid:
        for text in (uuid if uuid.startswith("GPU-") else f"GPU-{uuid}", uuid):
            handle = _try(lambda t=text: nvml.nvmlDeviceGetHandleByUUID(t))
            if handle is not None:
                break
    if handle is None and hasattr(props, "pci_bus_id"):
        domain, dev = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
        bus = f"{domain:08x}:{props.pci_bus_id:02x}:{dev:02x}.0"
        handle = _try(lambda: nvml.nvmlDeviceGetHandleByPciBusId(bus))
    _handles[device] = handle
    return handle


def _reasons_fn(nvml: Any) -> Any:
    # Renamed in newer NVML ("clocks event reasons"); the old name still works on older bindings.
    return getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or (
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )


def _try(fn: Any) -> Any:
    try:
        return fn()
    except Exception:  # one unreadable counter should not hide the others
        return None
