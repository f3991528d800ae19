"""Do the tensors a candidate keeps in a narrow dtype hold the program's own values, in numbers?

`Floors.stored` admits a value by its e-class, which is blind to what the abstract algebra drops:
layout (W * s and W * transpose(s) over a square W are one class when the program ties W's two dim
classes) and a mean's 1/n (sum(X) beside the program's mean(X)). So a complete candidate is also
run untiled on the fingerprints' small random inputs (`fingerprint.random_inputs`), and every
tensor one kernel writes for a later one, and every tile a block matmul reads in that dtype, must
be a program node's value up to a transpose, or that value scaled by a constant of magnitude at
most 1 (which fits wherever it does).
"""

from __future__ import annotations

from itertools import permutations

import numpy as np

from superopt.ops import Op
from superopt.primitives import apply
from superopt.program import Program
from superopt.reference import FloatAlgebra
from superopt.search.fingerprint import random_inputs, run_untiled
from superopt.sgraph import GraphKernel, SGraph

RTOL = 1e-9  # float64 sums in another order agree far closer; other values differ by far more


class StoredValues:
    """The program's node values at small sizes, by the sorted shape of each (a transpose's shape
    sorts the same), and the check of a candidate against them (`holds`)."""

    def __init__(self, program: Program) -> None:
        self.inputs = random_inputs(program)
        alg = FloatAlgebra(None)
        values: dict[str, np.ndarray] = {}
        with np.errstate(all="ignore"):
            for n in program.topological():
                if n.op == "input":
                    values[n.id] = self.inputs[n.id]
                    continue
                args = [values[i] for i in n.inputs]
                values[n.id] = np.asarray(apply(alg, n.op, args, n.attrs, [a.shape for a in args]), dtype=np.float64)
        self._by_shape: dict[tuple[int, ...], list[np.ndarray]] = {}
        for n in program.topological():
            if n.op != Op.CONST:
                self._by_shape.setdefault(tuple(sorted(values[n.id].shape)), []).append(values[n.id])

    @staticmethod
    def applies(program: Program) -> bool:
        """Can the program run at the fingerprints' sizes? A reshape's attributes name its real ones."""
        return all(n.op != Op.RESHAPE for n in program.nodes.values())

    def holds(self, sg: SGraph) -> bool:
        """Does every tensor `sg` keeps between kernels or stages for a block matmul in the kernel
        dtype (`sgraph._storage_plan`) hold a program value (up to a transpose, or scaled by a
        constant of magnitude at most 1)?"""
        alg = FloatAlgebra(None)
        tensors: dict[str, np.ndarray] = {t.id: self.inputs[t.id] for t in sg.inputs}
        info = sg.info
        with np.errstate(all="ignore"):
            for k in sg.kernels:
                if isinstance(k, GraphKernel):
                    vals = run_untiled(k, tensors)
                    block = info.blocks[k.id]
                    staged = [vals[t] for t, where in block.storage.items()
                              if where not in (None, "f32") and block.phase[t] != "input"]
                    if not all(map(self._own, staged)):
                        return False
                    tensors.update((o.tensor, vals[o.source]) for o in k.block.outputs)
                else:
                    args = [tensors[i] for i in k.inputs]
                    tensors[k.output] = np.asarray(apply(alg, k.op, args, k.attrs, [a.shape for a in args]))
        return all(self._own(tensors[t]) for k in sg.kernels for t in k.outputs if t not in sg.outputs)

    def _own(self, v: np.ndarray) -> bool:
        for u in self._by_shape.get(tuple(sorted(v.shape)), []):
            for perm in permutations(range(u.ndim)):
                w = np.transpose(u, perm)
                if w.shape != v.shape:
                    continue
                k = int(np.argmax(np.abs(w)))
                if w.flat[k] == 0 or not np.isfinite(w).all():
                    continue
                scale = v.flat[k] / w.flat[k]
                if abs(scale) <= 1 + RTOL and np.allclose(v, scale * w, rtol=RTOL, atol=RTOL * abs(w.flat[k])):
                    return True
        return False
