"""The float layer: the interpreter in the program's dtype against the float64 reference.

No guarantee in either direction (a tolerance can pass a tiny error and fail an equivalent but
less stable rewrite), so it is the last, numerical sanity check, never the equivalence oracle.
Inputs are fresh random values (never zeros) from fixed seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

from superopt.dtypes import dtype
from superopt.instantiate import Instance
from superopt.interpreter import run_float
from superopt.program import Program
from superopt.reference import inputs_and_reference, max_rel_err


@dataclass
class FloatCheck:
    max_rel_err: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.max_rel_err <= self.tolerance


def check(program: Program, inst: Instance, seed: int = 0) -> FloatCheck:
    inputs, refs = inputs_and_reference(program, seed)
    outs = run_float(inst, inputs)
    err = max(max_rel_err(o, r) for o, r in zip(outs, refs, strict=True))
    return FloatCheck(err, dtype(program.dtype).tolerance)
