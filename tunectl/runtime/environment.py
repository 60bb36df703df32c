"""Does this process fit the environment a bundle was tuned in? The matching rules (standard library only).

- device names are compared whole after normalising case, ``_`` and runs of spaces, and dropping a
  leading ``NVIDIA``: "NVIDIA H200" = "H200" = "nvidia_h200"; but "H200 NVL" is not "H200" and
  "H100 80GB HBM3" is not "H100" (other clocks, power limits, memory: a different tuning target).
  Never a prefix or substring match; a bundle may list more names under ``compatible_devices``;
- compute capability ("9.0", "90", "sm_90", (9, 0)), SM count and device kind must be equal;
- every library version the bundle records (not tunectl's) must equal the installed one, compared on
  the public version, and on the local label (``+cu130``) too where both have one; a library that
  is not installed here is not used here and is not a mismatch;
- where this process's device cannot be found, that is a problem too ("cannot confirm").

Policies: ``strict`` raises BundleEnvironmentError, ``warn`` logs each problem, ``off`` skips the check.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from tunectl.runtime.format import BundleEnvironmentError

ENV_POLICY_VAR = "TUNECTL_ENV_POLICY"
ENV_POLICIES = ("strict", "warn", "off")
log = logging.getLogger("tunectl.runtime")


def device_name_key(name: object) -> str:
    """A device name in the form names are compared in (see the module doc)."""
    text = re.sub(r"[\s_]+", " ", str(name)).strip().casefold()
    return text.removeprefix("nvidia ").strip()


def capability_key(value: object) -> str:
    """A compute capability as "major.minor" (plus an arch suffix): 9.0, "90", "sm_90" -> "9.0"."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return f"{int(value[0])}.{int(value[1])}"
    text = str(value).strip().lower().removeprefix("sm_").removeprefix("sm")
    match = re.fullmatch(r"(\d+)\.(\d+)([a-z]?)", text) or re.fullmatch(r"(\d+)(\d)([a-z]?)", text)
    if match:
        major, minor, suffix = match.groups()
        return f"{int(major)}.{int(minor)}{suffix}"
    return f"{int(text)}.0" if text.isdigit() else text


def _versions_differ(want: str, have: str) -> bool:
    (want_pub, _, want_local), (have_pub, _, have_local) = want.partition("+"), have.partition("+")
    return want_pub != have_pub or bool(want_local and have_local and want_local != have_local)


@cache
def _gpu_facts() -> tuple[str | None, str | None]:
    """(device name, compute capability) of this host's GPUs where all are one model; Nones otherwise."""
    names = set()
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                names.add(line.split(":", 1)[1].strip())
    smi = shutil.which("nvidia-smi")
    if smi and len(names) <= 1:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
            rows = {tuple(part.strip() for part in line.split(",")) for line in out.splitlines() if line}
            if len(rows) == 1:
                name, capability = next(iter(rows))
                return name, capability
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    return (next(iter(names)) if len(names) == 1 else None), None


def _cpu_name() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def current_environment() -> dict[str, Any]:
    """This process's device, found without third-party imports, and the installed library versions.

    ``$TUNECTL_DEVICE_NAME`` and ``$TUNECTL_COMPUTE_CAPABILITY`` override what is found (a GPU is
    found through NVIDIA's procfs and ``nvidia-smi``). Package versions are read on demand by
    ``check_environment``; pass ``{"packages": {...}}`` in ``environment=`` to state them instead.
    """
    name, capability = os.environ.get("TUNECTL_DEVICE_NAME"), os.environ.get("TUNECTL_COMPUTE_CAPABILITY")
    if not name:
        name, found_capability = _gpu_facts()
        capability = capability or found_capability
    if name:
        kind = "cpu" if name.startswith("cpu") else "cuda"
        return {
            "device_kind": kind,
            "device_name": name,
            **({"compute_capability": capability} if capability else {}),
        }
    cpu = _cpu_name()
    return {"device_kind": "cpu", **({"device_name": cpu} if cpu else {})}


def installed(package: str) -> str | None:
    """The installed version of ``package``; None where it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment_problems(wanted: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """How ``current`` differs from what the bundle's environment ``wanted`` (empty: it matches)."""
    problems = []
    names = [wanted.get("device_name"), *(wanted.get("compatible_devices") or [])]
    if names[0] is not None:
        have = current.get("device_name")
        if have is None:
            problems.append(
                f"device: bundle tuned on {names[0]!r}; cannot confirm this process's device "
                "(pass environment= or set TUNECTL_DEVICE_NAME)"
            )
        elif device_name_key(have) not in {device_name_key(n) for n in names if n is not None}:
            problems.append(f"device: bundle tuned on {names[0]!r}, this process has {have!r}")
    for fld, key in (("device_kind", str), ("compute_capability", capability_key), ("sm_count", str)):
        want, have = wanted.get(fld), current.get(fld)
        if want is not None and have is not None and key(want) != key(have):
            problems.append(f"{fld}: bundle tuned with {want!r}, this process has {have!r}")
    stated = current.get("packages")  # a caller's mapping is the whole truth; else ask the installation
    for package, want in sorted((wanted.get("packages") or {}).items()):
        have = stated.get(package) if stated is not None else installed(package)
        if package != "tunectl" and have is not None and _versions_differ(str(want), str(have)):
            problems.append(f"{package}: bundle tuned with {want}, this process has {have}")
    return problems


def check_environment(
    manifest: Mapping[str, Any], policy: str | None = None, current: Mapping[str, Any] | None = None
) -> list[str]:
    """Differences between the bundle's environment and ``current``; raise or log per ``policy``."""
    policy = policy or os.environ.get(ENV_POLICY_VAR) or "warn"
    if policy not in ENV_POLICIES:
        raise ValueError(f"env_policy must be one of {', '.join(ENV_POLICIES)}, not {policy!r}")
    if policy == "off":
        return []
    problems = environment_problems(
        manifest["environment"], current_environment() if current is None else current
    )
    where = f"{manifest['name']}/{manifest['version']}"
    if problems and policy == "strict":
        raise BundleEnvironmentError(where, tuple(problems))
    for problem in problems:
        log.warning("tunectl bundle %s: %s", where, problem)
    return problems
