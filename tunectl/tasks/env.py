"""The environment a measurement was made in: device and library versions."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
from functools import cache
from typing import Any

from tunectl.core.files import canonical_json

#: torch's allocator settings: they change how every measured kernel's memory is mapped, so a run's
#: processes take the driver's (``tunectl.orchestrator.compiling.worker_setup``) and rows record them
ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
_KERNEL_PACKAGES = ("flash-attn", "flash-attn-4", "flash-attn-3", "sgl-kernel", "nvidia-cutlass-dsl")
_PACKAGES = ("torch", "triton", *_KERNEL_PACKAGES, "flashinfer-python", "nvidia-cudnn-frontend", "tunectl")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@cache
def environment(device: str) -> dict[str, Any]:
    """Device name, compute capability, SM count, driver, CUDA and library versions; torch's allocator
    settings where set (``ALLOC_CONF_ENV``)."""
    import torch

    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "packages": {p: v for p in _PACKAGES if (v := _version(p)) is not None},
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        env.update(
            device_kind="cuda",
            device_name=props.name,
            compute_capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            cuda=torch.version.cuda,
            driver=_driver_version(),
        )
        if os.environ.get(ALLOC_CONF_ENV):
            env["cuda_alloc_conf"] = os.environ[ALLOC_CONF_ENV]
    else:
        env.update(device_kind="cpu", device_name=_cpu_name(), num_threads=torch.get_num_threads())
    return env


@cache
def env_json(device: str) -> str:
    return canonical_json(environment(device))


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu: " + (platform.processor() or platform.machine())


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:  # NVML missing or unusable: the driver is simply not recorded
        return None
