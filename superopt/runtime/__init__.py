"""GPU runtime: compile generated kernels with CuPy, check them against the float64 reference on
poisoned outputs, then time them (and the unfused baseline) with CUDA events.

Importing this package never imports CuPy: every function that needs a GPU imports it when called
and raises `GpuUnavailable` with the reason when there is none.
"""

from superopt.runtime.device import GpuUnavailable, device_fingerprint, fingerprint_text, gpu_available

__all__ = ["GpuUnavailable", "device_fingerprint", "fingerprint_text", "gpu_available"]
