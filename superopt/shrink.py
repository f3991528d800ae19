"""Shrink a program to small shapes with the same structure, so numeric checks stay cheap.

The symbolic proof covers every size; the finite-field and float layers run the interpreter,
whose cost grows with the shapes. Each dim class (superopt.dimclasses: dims equal by
construction) of size n becomes the largest divisor of n that is at most `cap`, so every split of
n that fits in the small size stays possible; it keeps n when that divisor is 1 (a prime n), and
a program that reshapes is not shrunk (a reshape ties dims in ways the classes do not follow).
"""

from __future__ import annotations

from superopt.assignments import divisors
from superopt.dimclasses import NO_CLASS, dim_classes
from superopt.program import Program, Tensor
from superopt.sgraph import SGraph, TensorDecl, rebind


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
        return program
    out = Program(program.name)
    for n in program.topological():
        if n.op == "input":
            out.input(n.id, shapes[n.id], n.dtype or "f32")
        else:
            out.op(n.op, *(Tensor(out, i) for i in n.inputs), name=n.id, **dict(n.attrs))
    out.outputs = list(program.outputs)
    return out.validate()


def shrink_sgraph(sg: SGraph, small: Program) -> SGraph:
    """The sGraph's structure over the shrunk program's inputs."""
    decls = [TensorDecl(n.id, n.shape, n.dtype or "f32") for n in small.inputs]
    return rebind(sg, decls)
