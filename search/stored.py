"""Do the tensors a candidate keeps in a narrow dtype hold the program's own values, in numbers?

`Floors.stored` admits a value by its e-class, which is blind to what the abstract algebra drops:
layout (W * s and W * transpose(s) over a square W are one class when the program ties W's two dim
classes) and a mean's 1/n (sum(X) beside the program's mean(X)). So a complete candidate is also
run untiled on small random inputs, and every tensor one kernel writes for a later one, and every
tile a block matmul reads in that dtype, must be a program node's value up to a transpose, or that
value scaled by a constant of magnitude at most 1 (which fits wherever it does). The small sizes
are the fingerprints' (`fingerprint.random_inputs`), or for a program with a reshape, whose
attributes name sizes, those `shrink` gives it and its candidates.
"""

from __future__ import annotations

import math
from itertools import permutations

import numpy as np

from superopt.ops import Op
from superopt.primitives import apply
from superopt.program import Program, ProgramError
from superopt.reference import FloatAlgebra, node_values
from superopt.search.fingerprint import SEED, random_inputs, run_untiled
from superopt.sgraph import GraphKernel, SGraph
from superopt.shrink import shrink, shrink_sgraph

RTOL = 1e-9  # float64 sums in another order agree far closer; other values differ by far more
SHRINK_CAP = 8  # `shrink`'s largest size: sums of few positive inputs keep an exp of them finite
MAX_ELEMENTS = 1 << 16  # of a shrunk program's largest value: checked for every candidate


class StoredValues:
    """The program's node values at small sizes without their size-1 dims (a kept reduced dim
    holds the same numbers), by the sorted shape of each (a transpose's shape sorts the same),
    and the check of a candidate against them (`holds`). `of` makes one."""

    def __init__(self, program: Program, small: Program, inputs: dict[str, np.ndarray]) -> None:
        self.program, self.small, self.inputs = program, small, inputs
        with np.errstate(all="ignore"):
            values = node_values(small, inputs, FloatAlgebra(None))
        self.finite = all(np.isfinite(v).all() for v in values.values())
        self._by_shape: dict[tuple[int, ...], list[np.ndarray]] = {}
        for n in small.topological():
            if n.op != Op.CONST:
                value = np.squeeze(values[n.id])
                self._by_shape.setdefault(tuple(sorted(value.shape)), []).append(value)

    @classmethod
    def of(cls, program: Program) -> StoredValues | None:
        """The check at the fingerprints' sizes, or with a reshape at `shrink`'s; None when the
        program does not shrink that far (a large prime dim, reshapes that regroup dims), or a
        value of it is not finite on those inputs (an exp of sums over positive inputs): its
        candidates keep the e-class rule alone."""
        if all(n.op != Op.RESHAPE for n in program.nodes.values()):
            made = cls(program, program, random_inputs(program))
        else:
            try:
                small = shrink(program, cap=SHRINK_CAP)
            except ProgramError:
                return None  # a dim too large to check that does not shrink
            if small is program or max(math.prod(n.shape) for n in small.nodes.values()) > MAX_ELEMENTS:
                return None
            rng = np.random.default_rng(SEED)
            made = cls(program, small, {n.id: rng.uniform(0.5, 1.5, n.shape) for n in small.inputs})
        return made if made.finite else None

    def holds(self, sg: SGraph) -> bool:
        """Does every tensor `sg` keeps between kernels or stages for a block matmul in the kernel
        dtype (`sgraph._storage_plan`) hold a program value (up to a transpose, or scaled by a
        constant of magnitude at most 1)?"""
        if self.small is not self.program:
            small = shrink_sgraph(sg, self.program, self.small)
            if small is None:
                return True  # its reshapes do not shrink as the program's do: the e-class rule alone
            sg = small
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
        v = np.squeeze(v)
        for u in self._by_shape.get(tuple(sorted(v.shape)), []):
            for perm in permutations(range(u.ndim)):
                w = np.transpose(u, perm)
                if w.shape != v.shape:
                    continue
                k = int(np.argmax(np.abs(w)))
                if w.flat[k] == 0:
                    continue
                scale = v.flat[k] / w.flat[k]
                if abs(scale) <= 1 + RTOL and np.allclose(v, scale * w, rtol=RTOL, atol=RTOL * abs(w.flat[k])):
                    return True
        return False
