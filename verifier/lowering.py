"""Lower programs and symbolic sGraphs into the prover's term language.

Both sides go through `superopt.primitives.apply`, so composite ops (rms_norm, softmax, ...) expand
through the same definitions every other layer uses; the one-operand elementwise composites
(sigmoid, silu, gelu) stay whole, and the prover spells them out only where it must. `TermAlgebra`
tracks each value's shape to make broadcasting explicit (`bcast` markers wherever a size-1 dim
meets a full one) and to count dims from the end. An sGraph lowers kernel by kernel: a
graph-defined kernel's input tile is its tensor with a `part` per split (grid axes, then the loop
axis), accumulators become `sum_over` / `mean_over` / `cat_over` over the loop axis, and each
output is the `cat_over` of its tile over the grid axes of its omap. Axes whose size is the
constant 1 split nothing and are left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from superopt.dimclasses import NO_CLASS, dim_classes
from superopt.ops import Op
from superopt.primitives import Algebra, apply
from superopt.program import Program
from superopt.sgraph import AccKind, GraphKernel, LibraryKernel, SGraph
from superopt.sizes import Size
from superopt.verifier import terms as t
from superopt.verifier.terms import ONE, Ext, Node

Extents = tuple[Ext, ...]
TV = tuple[Node, Extents]
ONE_SIZE = Size.const(1)


class TermAlgebra(Algebra[TV]):
    """Values are (term, extent of each dim); dims become negative, broadcasts explicit, and every
    sum and mean carries the extent it reduces."""

    def const(self, value: float) -> TV:
        return t.const(value), ()

    def _binary(self, op: str, x: TV, y: TV) -> TV:
        out = _broadcast(x[1], y[1])
        return t.binary(op, _expand(x, out), _expand(y, out)), out

    def add(self, a: TV, b: TV) -> TV:
        return self._binary(Op.ADD, a, b)

    def sub(self, a: TV, b: TV) -> TV:
        return self._binary(Op.SUB, a, b)

    def mul(self, a: TV, b: TV) -> TV:
        return self._binary(Op.MUL, a, b)

    def div(self, a: TV, b: TV) -> TV:
        return self._binary(Op.DIV, a, b)

    def neg(self, a: TV) -> TV:
        return t.unary(Op.NEG, a[0]), a[1]

    def exp(self, a: TV) -> TV:
        return t.unary(Op.EXP, a[0]), a[1]

    def sqrt(self, a: TV) -> TV:
        return t.unary(Op.SQRT, a[0]), a[1]

    def relu(self, a: TV) -> TV:
        return t.unary(Op.RELU, a[0]), a[1]

    def _reduce(self, op: str, a: TV, dim: int, keepdim: bool) -> TV:
        rank = len(a[1])
        i = dim % rank
        d = i - rank
        term = t.reduce(op, a[0], d, a[1][i])
        if keepdim:
            return term, (*a[1][:i], ONE, *a[1][i + 1:])
        return t.squeeze(term, d), (*a[1][:i], *a[1][i + 1:])

    def sum(self, a: TV, dim: int, keepdim: bool) -> TV:
        return self._reduce(Op.SUM, a, dim, keepdim)

    def max(self, a: TV, dim: int, keepdim: bool) -> TV:
        return self._reduce(Op.MAX, a, dim, keepdim)

    def mean(self, a: TV, dim: int, keepdim: bool, n: Any) -> TV:
        return self._reduce(Op.MEAN, a, dim, keepdim)

    def matmul(self, a: TV, b: TV) -> TV:
        batch = _broadcast(a[1][:-2], b[1][:-2])
        k = a[1][-1] if a[1][-1] != ONE else b[1][-2]
        return t.matmul(a[0], b[0], k), (*batch, a[1][-2], b[1][-1])

    def transpose(self, a: TV, perm: Sequence[int]) -> TV:
        return t.node(Op.TRANSPOSE, a[0], params=(",".join(map(str, perm)),)), tuple(a[1][p] for p in perm)

    def reshape(self, a: TV, shape: Sequence[int]) -> TV:
        return t.node(Op.RESHAPE, a[0], params=(",".join(map(str, shape)),)), tuple(_literal(s) for s in shape)

    def apply(self, op: str, args: Sequence[TV], attrs: Mapping[str, Any], shapes: Sequence[Any]) -> TV:
        """`primitives.apply`, except that a composite (`terms.COMPOSITES`) stays one symbol: a
        chain of gelus spelled out is a polynomial under a sigmoid at every link, whose products
        the algebra rules rearrange in more ways than a proof can hold."""
        if op in t.COMPOSITES:
            return t.unary(op, args[0][0]), args[0][1]
        return apply(self, op, args, attrs, shapes)


def _literal(size: int) -> Ext:
    """The extent of a dim a reshape makes: its size itself (a reshape's term names its sizes)."""
    return ONE if size == 1 else t.ext_sym(f"s{size}")


def _broadcast(x: Extents, y: Extents) -> Extents:
    """numpy's broadcast of two shapes, over extents (a unit dim takes the other's extent)."""
    rank = max(len(x), len(y))
    px, py = (ONE,) * (rank - len(x)) + x, (ONE,) * (rank - len(y)) + y
    return tuple(b if a == ONE else a for a, b in zip(px, py, strict=True))


def _expand(x: TV, out: Extents) -> Node:
    """Mark every dim where x is broadcast to `out` (constants broadcast everywhere implicitly)."""
    term, shape = x
    if not shape:
        return term
    for i in range(len(out), 0, -1):
        mine = shape[-i] if i <= len(shape) else ONE
        if mine == ONE and out[-i] != ONE:
            term = t.bcast(term, -i)
    return term


def program_extents(program: Program) -> dict[str, Extents]:
    """Every node's dims as extent symbols: one per dim class, `1` for unit dims; a class a
    reshape makes takes the reshape's literal size (the reshape's term names it)."""
    classes = dim_classes(program)
    literal = {c: program.nodes[nid].shape[d] for (nid, d), c in classes.items()
               if program.nodes[nid].op == Op.RESHAPE and c != NO_CLASS}

    def extent(c: int) -> Ext:
        if c == NO_CLASS:
            return ONE
        return _literal(literal[c]) if c in literal else t.ext_sym(f"n{c}")

    return {n.id: tuple(extent(classes[(n.id, d)]) for d in range(len(n.shape))) for n in program.topological()}


def lower_program(program: Program) -> list[Node]:
    alg = TermAlgebra()
    extents = program_extents(program)
    values: dict[str, TV] = {}
    for n in program.topological():
        if n.op == "input":
            values[n.id] = t.inp(n.id), extents[n.id]
            continue
        args = [values[i] for i in n.inputs]
        values[n.id] = alg.apply(n.op, args, n.attrs, [a[1] for a in args])
    return [values[o][0] for o in program.outputs]


def lower_sgraph(sg: SGraph, program: Program) -> tuple[list[Node], list[str]]:
    """The sGraph's outputs as terms, and the names of the axes they use. Its inputs (the
    program's) take the program's extents, so both sides name each dim class alike."""
    extents = program_extents(program)
    alg = TermAlgebra()
    values: dict[str, TV] = {d.id: (t.inp(d.id), extents[d.id]) for d in sg.inputs}
    axes: list[str] = []
    for k in sg.kernels:
        if isinstance(k, LibraryKernel):
            args = [values[i] for i in k.inputs]
            values[k.output] = alg.apply(k.op, args, k.attrs, [a[1] for a in args])
        else:
            values.update(_lower_block(sg, k, values, alg, axes))
    return [values[o][0] for o in sg.outputs], axes


def _split(exts: Extents, d: int, axis: str) -> Extents:
    return (*exts[:d], t.per(exts[d], axis), *exts[d + 1:])


def _gather(exts: Extents, d: int, axis: str) -> Extents:
    return (*exts[:d], t.times(exts[d], axis), *exts[d + 1:])


def _lower_block(sg: SGraph, k: GraphKernel, values: Mapping[str, TV], alg: TermAlgebra,
                 axes: list[str]) -> dict[str, TV]:
    b = k.block
    live = {a.name for a in b.axes if a.size != ONE_SIZE}
    axes.extend(sorted(live - set(axes)))
    loop = b.loop.name if b.loop.name in live else None
    vals: dict[str, TV] = {}
    for inp in b.inputs:
        term, exts = values[inp.tensor]
        rank = len(exts)
        for axis, d in zip(b.grid, inp.imap, strict=True):
            if d is not None and axis.name in live:
                term, exts = t.part(term, d - rank, axis.name), _split(exts, d, axis.name)
        if inp.fmap is not None and loop:
            term, exts = t.part(term, inp.fmap - rank, loop), _split(exts, inp.fmap, loop)
        vals[inp.id] = term, exts
    for op in b.body:
        args = [vals[i] for i in op.inputs]
        vals[op.id] = alg.apply(op.op, args, op.attrs, [x[1] for x in args])
    for acc in b.accumulators:
        term, exts = vals[acc.source]
        if loop:
            if acc.kind == AccKind.SUM:
                term = t.sum_over(term, loop)
            elif acc.kind == AccKind.MEAN:
                term = t.mean_over(term, loop)
            else:
                assert acc.dim is not None
                term, exts = t.cat_over(term, acc.dim - len(exts), loop), _gather(exts, acc.dim, loop)
        vals[acc.id] = term, exts
    for op in b.post:
        args = [vals[i] for i in op.inputs]
        vals[op.id] = alg.apply(op.op, args, op.attrs, [x[1] for x in args])
    out: dict[str, TV] = {}
    for o in b.outputs:
        term, exts = vals[o.source]
        rank = len(exts)
        for axis, d in zip(b.grid, o.omap, strict=True):
            if axis.name in live:
                term, exts = t.cat_over(term, d - rank, axis.name), _gather(exts, d, axis.name)
        out[o.tensor] = term, exts
    return out
