"""Shrink a program to small shapes with the same structure, so numeric checks stay cheap.

The symbolic proof covers every size; the finite-field and float layers run the interpreter,
whose cost grows with the shapes. Dims that must be equal (matmul inner dims, broadcast
partners, batch dims) are unified into classes; each class of size n becomes the largest divisor
of n that is at most `cap` (so every split of n that fits in the small size stays possible), and
keeps n when that divisor would be 1 (a prime n) or when the program reshapes (a reshape ties
dims in ways the classes do not follow).
"""

from __future__ import annotations

from superopt.assignments import divisors
from superopt.program import Program, Tensor
from superopt.sgraph import SGraph, TensorDecl, rebind


class _Classes:
    def __init__(self) -> None:
        self.parent: dict[tuple[str, int], tuple[str, int]] = {}

    def find(self, x: tuple[str, int]) -> tuple[str, int]:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, x: tuple[str, int], y: tuple[str, int]) -> None:
        self.parent[self.find(x)] = self.find(y)


def shrink(program: Program, cap: int = 32) -> Program:
    """The same program over small shapes (or the program itself when nothing can shrink)."""
    if any(n.op == "reshape" for n in program.nodes.values()):
        return program
    cls = _Classes()
    for n in program.topological():
        ins = [program.nodes[i] for i in n.inputs]
        rank = len(n.shape)
        for d in range(rank):
            cls.find((n.id, d))
        if n.op == "matmul":
            a, b = ins
            cls.union((a.id, rank - 1), (b.id, rank - 2))
            cls.union((n.id, rank - 2), (a.id, rank - 2))
            cls.union((n.id, rank - 1), (b.id, rank - 1))
            for d in range(rank - 2):
                cls.union((a.id, d), (b.id, d))
                cls.union((n.id, d), (a.id, d))
        elif n.op == "transpose":
            for d, p in enumerate(n.attrs["perm"]):
                cls.union((n.id, d), (ins[0].id, p))
        elif n.op in ("sum", "mean", "max"):
            src = ins[0]
            dim = n.attrs["dim"] % len(src.shape)
            kept = [d for d in range(len(src.shape)) if d != dim or n.attrs["keepdim"]]
            for out_d, in_d in enumerate(kept):
                if in_d != dim:
                    cls.union((n.id, out_d), (src.id, in_d))
        else:
            for a in ins:
                for i in range(1, len(a.shape) + 1):
                    if a.shape[-i] == n.shape[-i] and a.shape[-i] != 1:
                        cls.union((n.id, rank - i), (a.id, len(a.shape) - i))
    new_size: dict[tuple[str, int], int] = {}
    for n in program.nodes.values():
        for d, size in enumerate(n.shape):
            root = cls.find((n.id, d))
            small = max(x for x in divisors(size) if x <= cap) if size > 1 else 1
            new_size.setdefault(root, small if small > 1 or size == 1 else size)
    out = Program(program.name)
    shapes = {n.id: tuple(new_size[cls.find((n.id, d))] for d in range(len(n.shape))) for n in program.inputs}
    if all(shapes[n.id] == n.shape for n in program.inputs):
        return program
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
