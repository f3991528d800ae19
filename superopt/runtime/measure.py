"""Correct first, then fast: check a program's kernels against the float64 reference on fresh
random inputs with poisoned outputs, and only then time them with CUDA events.

Timing is `cupyx.profiler.benchmark` (CUDA events around each run of the whole kernel graph on
one stream), reported as the median of `n_repeat` runs after `n_warmup` untimed ones.
"""

from __future__ import annotations

import importlib
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from superopt.build import unfused_baseline
from superopt.codegen import CudaProgram, generate
from superopt.dtypes import dtype as get_dtype
from superopt.instantiate import instantiate
from superopt.program import Program
from superopt.reference import inputs_and_reference, max_rel_err
from superopt.runtime.executor import DeviceProgram
from superopt.sgraph import SGraph, check_matches
from superopt.targets import Target

N_REPEAT = 200
N_WARMUP = 20


class IncorrectKernel(AssertionError):
    """Generated kernels whose output differs from the reference beyond the dtype's tolerance."""


@dataclass
class Measurement:
    name: str
    median_us: float
    min_us: float
    runs: int
    max_rel_err: float
    tolerance: float
    launches: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def check(program: Program, dev: DeviceProgram, seed: int = 0) -> float:
    """Max relative error of the device program on fresh inputs, outputs poisoned beforehand;
    raises IncorrectKernel above the tolerance."""
    inputs, refs = inputs_and_reference(program, seed)
    dev.set_inputs(inputs)
    dev.poison()
    dev.run()
    outs = dev.outputs()
    err = max(max_rel_err(o, r) for o, r in zip(outs, refs, strict=True))
    tol = get_dtype(program.dtype).tolerance
    if not err <= tol:
        raise IncorrectKernel(f"{program.name}: max relative error {err:.3e} exceeds the {program.dtype} "
                              f"tolerance {tol:.0e} (seed {seed})")
    return err


def benchmark(dev: DeviceProgram, n_repeat: int = N_REPEAT, n_warmup: int = N_WARMUP) -> tuple[float, float]:
    """(median, min) GPU time of one run of the whole kernel graph, in microseconds."""
    profiler = importlib.import_module("cupyx.profiler")
    res = profiler.benchmark(dev.run, n_repeat=n_repeat, n_warmup=n_warmup)
    times = [float(t) * 1e6 for t in res.gpu_times[0]]
    return statistics.median(times), min(times)


def measure_program(program: Program, prog: CudaProgram, name: str, seed: int = 0,
                    n_repeat: int = N_REPEAT, n_warmup: int = N_WARMUP) -> Measurement:
    dev = DeviceProgram(prog)
    err = check(program, dev, seed)
    median, fastest = benchmark(dev, n_repeat, n_warmup)
    return Measurement(name, median, fastest, n_repeat, err, get_dtype(program.dtype).tolerance, dev.launches)


def measure(program: Program, sg: SGraph, params: dict[str, int], target: Target, seed: int = 0,
            n_repeat: int = N_REPEAT, n_warmup: int = N_WARMUP) -> Measurement:
    """Check, then time, an sGraph at the given parameters."""
    check_matches(sg, program)
    prog = generate(instantiate(sg, params, target))
    return measure_program(program, prog, sg.name, seed, n_repeat, n_warmup)


def measure_baseline(program: Program, target: Target, seed: int = 0, n_repeat: int = N_REPEAT,
                     n_warmup: int = N_WARMUP) -> Measurement:
    """The unfused baseline (one library kernel per op), checked and timed the same way."""
    return measure(program, unfused_baseline(program), {}, target, seed, n_repeat, n_warmup)
