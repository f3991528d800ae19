"""Finding a GPU: CuPy imported only when asked for, and the identity of the device it drives.

Nothing here (or anywhere in superopt) imports CuPy at import time, so superopt works on machines
without CuPy or a GPU; `require_cupy` says precisely why a GPU path cannot run.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class GpuUnavailable(RuntimeError):
    """No usable GPU: CuPy is missing, or it finds no device (the message says which)."""


def require_cupy() -> ModuleType:
    """The CuPy module, with a device present; raises GpuUnavailable otherwise."""
    try:
        cp = importlib.import_module("cupy")
    except ImportError as e:
        raise GpuUnavailable(f"CuPy is not installed ({e}); install cupy-cuda13x on a machine with a GPU") from None
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # CuPy raises CUDARuntimeError without a driver
        raise GpuUnavailable(f"CuPy finds no usable CUDA device: {e}") from None
    if count < 1:
        raise GpuUnavailable("CuPy finds no CUDA device")
    return cp


def gpu_available() -> tuple[bool, str]:
    """(True, device name) or (False, the reason)."""
    try:
        cp = require_cupy()
    except GpuUnavailable as e:
        return False, str(e)
    return True, _name(cp)


def _name(cp: ModuleType) -> str:
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def device_fingerprint() -> dict[str, Any]:
    """Identity of the current device for the kernel cache key: a kernel measured on one GPU,
    driver, CUDA or CuPy version is not a measurement for another."""
    cp = require_cupy()
    cc = str(cp.cuda.Device().compute_capability)  # "90" for sm_90, "100" for sm_100
    return {
        "device": _name(cp),
        "compute_capability": f"{cc[:-1]}.{cc[-1]}",
        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "cuda_driver": cp.cuda.runtime.driverGetVersion(),
        "cupy": cp.__version__,
    }


def fingerprint_text(fp: dict[str, Any]) -> str:
    """The fingerprint as one stable string (the cache key's target part)."""
    return (f"gpu:{fp['device']}:sm{fp['compute_capability']}:cuda{fp['cuda_runtime']}:"
            f"driver{fp['cuda_driver']}:cupy{fp['cupy']}")
