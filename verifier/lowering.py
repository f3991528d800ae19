"""Lower programs and symbolic sGraphs into the prover's term language.

Both sides go through `superopt.primitives.apply`, so composite ops (rms_norm, silu, ...) expand
through the same definitions every other layer uses. `TermAlgebra` tracks each value's shape to
make broadcasting explicit (`bcast` markers wherever a size-1 dim meets a full one) and to count
dims from the end. An sGraph lowers kernel by kernel: a graph-defined kernel's input tile is its
tensor with a `part` per split (grid axes, then the loop axis), accumulators become
`sum_over` / `mean_over` / `cat_over` over the loop axis, and each output is the `cat_over` of its
tile over the grid axes of its omap. Axes whose size is the constant 1 split nothing and are
left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from superopt import ops
from superopt.primitives import Algebra, apply
from superopt.program import Program
from superopt.sgraph import GraphKernel, LibraryKernel, SGraph
from superopt.sizes import Size
from superopt.verifier import terms as t
from superopt.verifier.terms import Node

Shape = tuple[Size, ...]
TV = tuple[Node, Shape]
ONE = Size.const(1)


class TermAlgebra(Algebra[TV]):
    """Values are (term, shape); dims become negative, broadcasts explicit, mean stays atomic."""

    def const(self, value: float) -> TV:
        return t.const(value), ()

    def _binary(self, op: str, x: TV, y: TV) -> TV:
        out = ops.broadcast(x[1], y[1])
        return t.binary(op, _expand(x, out), _expand(y, out)), out

    def add(self, a: TV, b: TV) -> TV:
        return self._binary("add", a, b)

    def sub(self, a: TV, b: TV) -> TV:
        return self._binary("sub", a, b)

    def mul(self, a: TV, b: TV) -> TV:
        return self._binary("mul", a, b)

    def div(self, a: TV, b: TV) -> TV:
        return self._binary("div", a, b)

    def neg(self, a: TV) -> TV:
        return t.unary("neg", a[0]), a[1]

    def exp(self, a: TV) -> TV:
        return t.unary("exp", a[0]), a[1]

    def sqrt(self, a: TV) -> TV:
        return t.unary("sqrt", a[0]), a[1]

    def relu(self, a: TV) -> TV:
        return t.unary("relu", a[0]), a[1]

    def _reduce(self, op: str, a: TV, dim: int, keepdim: bool) -> TV:
        rank = len(a[1])
        d = ops.normalize_dim(dim, rank) - rank
        kept = (*a[1][: rank + d], ONE, *a[1][rank + d + 1 :])
        term = t.reduce(op, a[0], d)
        if keepdim:
            return term, kept
        return t.squeeze(term, d), (*a[1][: rank + d], *a[1][rank + d + 1 :])

    def sum(self, a: TV, dim: int, keepdim: bool) -> TV:
        return self._reduce("sum", a, dim, keepdim)

    def max(self, a: TV, dim: int, keepdim: bool) -> TV:
        return self._reduce("max", a, dim, keepdim)

    def mean(self, a: TV, dim: int, keepdim: bool, n: Any) -> TV:
        return self._reduce("mean", a, dim, keepdim)

    def matmul(self, a: TV, b: TV) -> TV:
        return t.matmul(a[0], b[0]), (*a[1][:-1], b[1][-1])

    def transpose(self, a: TV, perm: Sequence[int]) -> TV:
        return t.node("transpose", a[0], params=(",".join(map(str, perm)),)), tuple(a[1][p] for p in perm)

    def reshape(self, a: TV, shape: Sequence[int]) -> TV:
        return t.node("reshape", a[0], params=(",".join(map(str, shape)),)), tuple(Size.of(s) for s in shape)


def _expand(x: TV, out: Shape) -> Node:
    """Mark every dim where x is broadcast to `out` (constants broadcast everywhere implicitly)."""
    term, shape = x
    if not shape:
        return term
    for i in range(len(out), 0, -1):
        mine = shape[-i] if i <= len(shape) else ONE
        if mine == ONE and out[-i] != ONE:
            term = t.bcast(term, -i)
    return term


def lower_program(program: Program) -> list[Node]:
    alg = TermAlgebra()
    values: dict[str, TV] = {}
    for n in program.topological():
        if n.op == "input":
            values[n.id] = t.inp(n.id), n.size_shape
            continue
        args = [values[i] for i in n.inputs]
        values[n.id] = apply(alg, n.op, args, n.attrs, [a[1] for a in args])
    return [values[o][0] for o in program.outputs]


def lower_sgraph(sg: SGraph) -> tuple[list[Node], list[str]]:
    """The sGraph's outputs as terms, and the names of the axes they use."""
    alg = TermAlgebra()
    info = sg.info
    values: dict[str, TV] = {d.id: (t.inp(d.id), info.shapes[d.id]) for d in sg.inputs}
    axes: list[str] = []
    for k in sg.kernels:
        if isinstance(k, LibraryKernel):
            args = [values[i] for i in k.inputs]
            values[k.output] = apply(alg, k.op, args, k.attrs, [a[1] for a in args])[0], info.shapes[k.output]
        else:
            values.update(_lower_block(sg, k, values, alg, axes))
    return [values[o][0] for o in sg.outputs], axes


def _lower_block(sg: SGraph, k: GraphKernel, values: dict[str, TV], alg: TermAlgebra, axes: list[str]) -> dict[str, TV]:
    b = k.block
    tiles = sg.info.blocks[k.id].shapes
    live = {a.name for a in b.axes if a.size != ONE}
    axes.extend(sorted(live - set(axes)))
    loop = b.loop.name if b.loop.name in live else None
    vals: dict[str, TV] = {}
    for inp in b.inputs:
        term = values[inp.tensor][0]
        rank = len(sg.info.shapes[inp.tensor])
        for axis, d in zip(b.grid, inp.imap, strict=True):
            if d is not None and axis.name in live:
                term = t.part(term, d - rank, axis.name)
        if inp.fmap is not None and loop:
            term = t.part(term, inp.fmap - rank, loop)
        vals[inp.id] = term, tiles[inp.id]
    for op in b.body:
        args = [vals[i] for i in op.inputs]
        vals[op.id] = apply(alg, op.op, args, op.attrs, [x[1] for x in args])[0], tiles[op.id]
    for acc in b.accumulators:
        term = vals[acc.source][0]
        if loop:
            if acc.kind == "sum":
                term = t.sum_over(term, loop)
            elif acc.kind == "mean":
                term = t.mean_over(term, loop)
            else:
                assert acc.dim is not None
                term = t.cat_over(term, acc.dim - len(tiles[acc.source]), loop)
        vals[acc.id] = term, tiles[acc.id]
    for op in b.post:
        args = [vals[i] for i in op.inputs]
        vals[op.id] = apply(alg, op.op, args, op.attrs, [x[1] for x in args])[0], tiles[op.id]
    out: dict[str, TV] = {}
    for o in b.outputs:
        term = vals[o.source][0]
        rank = len(tiles[o.source])
        for axis, d in zip(b.grid, o.omap, strict=True):
            if axis.name in live:
                term = t.cat_over(term, d - rank, axis.name)
        out[o.tensor] = term, sg.info.shapes[o.tensor]
    return out
