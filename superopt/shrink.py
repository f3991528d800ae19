"""Shrink a program to small shapes with the same structure, so numeric checks stay cheap.

The symbolic proof covers every size; the finite-field and float layers run the interpreter,
whose cost grows with the shapes. Each dim class (superopt.dimclasses: dims equal by
construction) of size n becomes the largest divisor of n that is at most `cap`, so every split of
n that fits in the small size stays possible; it keeps n when that divisor is 1 (a prime n), and
a program that reshapes is not shrunk (a reshape ties dims in ways the classes do not follow).
"""

from __future__ import annotations

import math

from superopt.assignments import divisors
from superopt.dimclasses import NO_CLASS, dim_classes
from superopt.program import Program, ProgramError, Tensor
from superopt.sgraph import SGraph, TensorDecl, rebind

MAX_CHECKED_ELEMENTS = 2**26  # per tensor of a program evaluated by a check (float64: 512 MiB)


def shrink(program: Program, cap: int = 32) -> Program:
    """The same program over small shapes (or the program itself when nothing can shrink)."""
    if any(n.op == "reshape" for n in program.nodes.values()):
        return program
    classes = dim_classes(program)
    new_size: dict[int, int] = {}
    for n in program.nodes.values():
        for d, size in enumerate(n.shape):
            c = classes[(n.id, d)]
            if c != NO_CLASS:
                small = max(x for x in divisors(size) if x <= cap)
                new_size.setdefault(c, small if small > 1 else size)
    shapes = {
        n.id: tuple(1 if classes[(n.id, d)] == NO_CLASS else new_size[classes[(n.id, d)]] for d in range(len(n.shape)))
        for n in program.inputs
    }
    if all(shapes[n.id] == n.shape for n in program.inputs):
        return _checkable(program)
    out = Program(program.name)
    for n in program.topological():
        if n.op == "input":
            out.input(n.id, shapes[n.id], n.dtype or "f32")
        else:
            out.op(n.op, *(Tensor(out, i) for i in n.inputs), name=n.id, **dict(n.attrs))
    out.outputs = list(program.outputs)
    return _checkable(out.validate())


def _checkable(small: Program) -> Program:
    """`small`, unless evaluating it (in float64, as the checks do) would take too much memory: a
    dim with no divisor up to the cap (a large prime) keeps its full size."""
    big = max(small.nodes.values(), key=lambda n: math.prod(n.shape))
    if math.prod(big.shape) > MAX_CHECKED_ELEMENTS:
        raise ProgramError(f"node {big.id!r} ({big.op}): checking the program needs it at shape {list(big.shape)} "
                           f"(a dim with no small divisor, or a reshape, keeps its size), over the "
                           f"{MAX_CHECKED_ELEMENTS:,} elements a check evaluates")
    return small


def shrink_sgraph(sg: SGraph, small: Program) -> SGraph:
    """The sGraph's structure over the shrunk program's inputs."""
    decls = [TensorDecl(n.id, n.shape, n.dtype or "f32") for n in small.inputs]
    return rebind(sg, decls)
