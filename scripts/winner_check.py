"""An independent check of a searched winner, for the generated-program scripts (`fuzz_optimize.py`,
`bench_generality.py`, `--check`): the winner's generated CUDA, compiled by g++ and run in the CPU
harness (tests/cuda_harness) on fresh random inputs, against a float64 numpy evaluation of the
program written here from each op's textbook definition (gelu through tanh, softmax with its max
subtracted), sharing no code with superopt's reference evaluator, its op primitives or its prover.

Large programs are checked at small shapes: the program shrunk with its dim classes kept apart
(`superopt.shrink`, as verification's numeric layers do) and the winner rebound to it, under the
cost model's parameters there (a winner is symbolic in its sizes). A winner that has no valid
instantiation at the small shapes is checked at the real ones when they are small enough. The
inputs are fresh random ones (never zero), given one sign each where the program is undefined at
signed ones (a square root of X @ W): `superopt.reference.inputs_and_reference` picks them; its
values are not used.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from cuda_harness import runner

from superopt.codegen import generate
from superopt.costmodel import best_params
from superopt.dtypes import dtype
from superopt.instantiate import instantiate
from superopt.ops import Op
from superopt.program import Program
from superopt.reference import inputs_and_reference, max_rel_err
from superopt.sgraph import SGraph
from superopt.shrink import shrink, shrink_sgraph
from superopt.targets import TARGETS

REAL_SHAPES_ELEMENTS = 1 << 18  # elements of the largest tensor a check at the real shapes may hold
H100 = TARGETS["h100"]


def _softmax(x: np.ndarray, dim: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    Op.NEG: np.negative, Op.EXP: np.exp, Op.SQRT: np.sqrt, Op.RSQRT: lambda x: 1.0 / np.sqrt(x),
    Op.SQUARE: np.square, Op.RELU: lambda x: np.maximum(x, 0.0), Op.SIGMOID: lambda x: 1.0 / (1.0 + np.exp(-x)),
    Op.SILU: lambda x: x / (1.0 + np.exp(-x)), Op.GELU: _gelu,
}
BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.divide,
}
REDUCE: dict[str, Callable[..., np.ndarray]] = {Op.SUM: np.sum, Op.MEAN: np.mean, Op.MAX: np.max}


def numpy_outputs(program: Program, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The program's outputs in float64 numpy, op by op from the definitions above (where the
    program is undefined, NaN, without a warning)."""
    with np.errstate(all="ignore"):
        return _evaluate(program, inputs)


def _evaluate(program: Program, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    values: dict[str, np.ndarray] = {}
    for n in program.topological():
        a = [values[i] for i in n.inputs]
        at = n.attrs
        if n.op == "input":
            v = np.asarray(inputs[n.id], dtype=np.float64)
        elif n.op == Op.CONST:
            v = np.float64(at["value"])
        elif n.op in UNARY:
            v = UNARY[n.op](a[0])
        elif n.op in BINARY:
            v = BINARY[n.op](a[0], a[1])
        elif n.op in REDUCE:
            v = REDUCE[n.op](a[0], axis=at["dim"], keepdims=bool(at.get("keepdim", False)))
        elif n.op == Op.MATMUL:
            v = np.matmul(a[0], a[1])
        elif n.op == Op.RMS_NORM:
            v = a[0] / np.sqrt(np.mean(a[0] ** 2, axis=at.get("dim", -1), keepdims=True) + at.get("eps", 1e-6))
        elif n.op == Op.SOFTMAX:
            v = _softmax(a[0], at.get("dim", -1))
        elif n.op == Op.TRANSPOSE:
            v = np.transpose(a[0], at["perm"])
        elif n.op == Op.RESHAPE:
            v = np.reshape(a[0], at["shape"])
        else:
            raise ValueError(f"node {n.id!r}: no numpy definition of op {n.op!r}")
        values[n.id] = v
    return [values[o] for o in program.outputs]


@dataclass(frozen=True)
class Check:
    error: float  # the largest normwise relative error over the outputs: max|got - want| / max|want|
    tolerance: float  # the program dtype's
    shapes: str  # "small" or "real"
    params: dict[str, int]

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance


def check_winner(program: Program, sg: SGraph, seed: int) -> Check | str:
    """Run the winner's CUDA in the CPU harness against `numpy_outputs`: the check, or why it
    could not run (no g++, no instantiation at shapes small enough to emulate)."""
    if runner.gxx() is None:
        return "g++ is not on PATH: the CPU harness needs it"
    small = shrink(program)
    rebound = shrink_sgraph(sg, program, small) if small is not program else sg
    shapes = "small"
    if rebound is None or (params := _params(rebound)) is None:
        largest = max(math.prod(n.shape) for n in program.nodes.values())
        if largest > REAL_SHAPES_ELEMENTS or (params := _params(sg)) is None:
            return "no instantiation at shapes small enough to emulate"
        small, rebound, shapes = program, sg, "real"
    prog = generate(instantiate(rebound, params, H100))
    runner.compile_all([prog])
    inputs, _ = inputs_and_reference(small, seed)  # fresh random inputs, signed where the program allows
    want = numpy_outputs(small, inputs)
    if not all(np.all(np.isfinite(w)) for w in want):
        return "the program is undefined at every input sign pattern tried"
    got = runner.run(prog, inputs)
    error = max((max_rel_err(g, w) for g, w in zip(got, want, strict=True)), default=0.0)
    return Check(error, dtype(program.dtype).tolerance, shapes, params)


def _params(sg: SGraph) -> dict[str, int] | None:
    try:
        return best_params(sg, H100)
    except ValueError:
        return None
