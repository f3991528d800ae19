"""Numeric fingerprints of what a graph kernel computes, for telling equal values apart from
equal abstract expressions.

Abstract expressions drop constants the program lacks (x / 8 and x * 8 are one where 8 is not a
program constant), so two first kernels
with the same expressions need not compute the same tensors; and one value has many block
graphs (a scale applied to Q, to K or to Q K). A kernel's fingerprint is its block graph run
untiled (an accumulator is the identity, as in the abstract algebra) in float64 on fixed random
inputs, every program dim class at a small size of its own, each output rounded to float32:
kernels computing the same function agree; different functions collide only by accident.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from superopt.dimclasses import NO_CLASS, input_classes
from superopt.primitives import apply
from superopt.program import Program
from superopt.reference import FloatAlgebra
from superopt.sgraph import BlockOp, GraphKernel

SIZES = (3, 2, 5, 4, 7, 6)  # the size of program dim class c is SIZES[c % 6]: small, mostly distinct
SEED = 20261130


def random_inputs(program: Program) -> dict[str, np.ndarray]:
    """Fixed random positive inputs (square roots and divisions stay defined) at small sizes."""
    rng = np.random.default_rng(SEED)
    return {
        name: rng.uniform(0.5, 1.5, tuple(1 if c == NO_CLASS else SIZES[c % len(SIZES)] for c in classes))
        for name, classes in input_classes(program).items()
    }


def run_untiled(kernel: GraphKernel, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every block tensor of the kernel, its block graph evaluated untiled in float64 on `tensors`
    (its inputs by tensor id): an accumulator is the identity, as in the abstract algebra."""
    alg = FloatAlgebra(None)
    b = kernel.block
    vals: dict[str, np.ndarray] = {i.id: tensors[i.tensor] for i in b.inputs}

    def run(ops: tuple[BlockOp, ...]) -> None:
        for op in ops:
            args = [vals[i] for i in op.inputs]
            vals[op.id] = apply(alg, op.op, args, op.attrs, [a.shape for a in args])

    with np.errstate(all="ignore"):  # an exp may overflow
        run(b.body)
        vals.update((acc.id, vals[acc.source]) for acc in b.accumulators)
        run(b.post)
    return vals


def fingerprint(kernel: GraphKernel, tensors: Mapping[str, np.ndarray]) -> tuple[bytes, ...]:
    """The kernel's outputs, in order, evaluated untiled on `tensors` (its inputs by tensor id)."""
    vals = run_untiled(kernel, tensors)
    outs = [vals[o.source] for o in kernel.block.outputs]
    with np.errstate(all="ignore"):  # and so may its float32 rounding
        return tuple(repr(v.shape).encode() + v.astype(np.float32).tobytes() for v in outs)
