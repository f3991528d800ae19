"""The cost model's calibration hook: measure what the datasheet figures stand for on this GPU.

DRAM bandwidth from a large device-to-device copy, the tensor-core peak from a large f16 GEMM,
launch overhead from an empty kernel; `Target.calibrated` takes the three.
"""

from __future__ import annotations

import importlib
import statistics
from typing import Any

from superopt.runtime.device import require_cupy
from superopt.targets import Target

EMPTY_KERNEL = 'extern "C" __global__ void superopt_empty() {}'


def _median_s(fn: Any, n_repeat: int) -> float:
    profiler = importlib.import_module("cupyx.profiler")
    res = profiler.benchmark(fn, n_repeat=n_repeat, n_warmup=5)
    return statistics.median(float(t) for t in res.gpu_times[0])


def calibrate(base: Target, copy_bytes: int = 1 << 30, gemm: int = 8192, n_repeat: int = 20) -> Target:
    """`base` with measured bandwidth, tensor peak and launch overhead."""
    cp = require_cupy()
    src = cp.empty(copy_bytes // 2, dtype=cp.float16)
    dst = cp.empty_like(src)
    copy_s = _median_s(lambda: cp.copyto(dst, src), n_repeat)
    a = cp.ones((gemm, gemm), dtype=cp.float16)
    c = cp.empty_like(a)
    gemm_s = _median_s(lambda: cp.matmul(a, a, out=c), n_repeat)
    empty = cp.RawKernel(EMPTY_KERNEL, "superopt_empty")
    launch_s = _median_s(lambda: empty((1,), (1,), ()), 10 * n_repeat)
    return base.calibrated(
        dram_bytes_per_s=2 * copy_bytes / copy_s,  # read + write
        tensor_flops=2 * gemm**3 / gemm_s,
        launch_overhead_s=launch_s,
    )
