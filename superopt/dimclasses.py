"""Dim classes of a program: which tensor dims must have the same extent by construction.

A matmul ties its left operand's last dim to the right operand's second-last and its batch dims
together; an elementwise op ties aligned dims of equal extent (a size-1 dim broadcasts and ties
nothing); reductions, transposes and normalizations carry the other dims through. Each class gets
a small integer, numbered in the order the program first uses it, so equal programs give equal
numbers. Size-1 dims have no class (-1). Reshape dims get classes of their own (a reshape ties
dims in ways the classes do not follow).

The search matches dims by class ("symbolic dimension matching"): a block reduction or a
contraction is over a class, and the abstract expressions the pruning oracle compares record it.
"""

from __future__ import annotations

from superopt.ops import REDUCE, Op
from superopt.program import Program

NO_CLASS = -1


class _UnionFind:
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


def dim_classes(program: Program) -> dict[tuple[str, int], int]:
    """(node id, dim) -> class number, or NO_CLASS for size-1 dims."""
    uf = _UnionFind()
    for n in program.topological():
        ins = [program.nodes[i] for i in n.inputs]
        rank = len(n.shape)
        for d in range(rank):
            uf.find((n.id, d))
        if n.op == Op.MATMUL:
            a, b = ins
            uf.union((a.id, rank - 1), (b.id, rank - 2))
            uf.union((n.id, rank - 2), (a.id, rank - 2))
            uf.union((n.id, rank - 1), (b.id, rank - 1))
            for d in range(rank - 2):
                uf.union((a.id, d), (b.id, d))
                uf.union((n.id, d), (a.id, d))
        elif n.op == Op.TRANSPOSE:
            for d, p in enumerate(n.attrs["perm"]):
                uf.union((n.id, d), (ins[0].id, p))
        elif n.op in REDUCE:
            src = ins[0]
            dim = n.attrs["dim"] % len(src.shape)
            kept = [d for d in range(len(src.shape)) if d != dim or n.attrs["keepdim"]]
            for out_d, in_d in enumerate(kept):
                if in_d != dim:
                    uf.union((n.id, out_d), (src.id, in_d))
        elif n.op != Op.RESHAPE:
            for a in ins:
                for i in range(1, len(a.shape) + 1):
                    if a.shape[-i] == n.shape[-i] and a.shape[-i] != 1:
                        uf.union((n.id, rank - i), (a.id, len(a.shape) - i))
    numbers: dict[tuple[str, int], int] = {}
    out: dict[tuple[str, int], int] = {}
    for n in program.topological():
        for d, size in enumerate(n.shape):
            if size == 1:
                out[(n.id, d)] = NO_CLASS
                continue
            root = uf.find((n.id, d))
            out[(n.id, d)] = numbers.setdefault(root, len(numbers))
    return out


def input_classes(program: Program) -> dict[str, tuple[int, ...]]:
    classes = dim_classes(program)
    return {n.id: tuple(classes[(n.id, d)] for d in range(len(n.shape))) for n in program.inputs}
