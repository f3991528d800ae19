"""Automatically generated wrong variants of an sGraph: the test equipment of every checking layer.

Each mutation changes one thing a schedule writer (or a buggy search) could get wrong: a map moved,
a split replaced by a replica, an accumulator swapped, an op dropped or changed, operands swapped,
a reduction dim or constant changed. Only variants that are still well-formed sGraphs for the same
program are returned; whether a variant is really wrong is for the interpreter to show.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

from superopt import ops
from superopt.ops import Op
from superopt.program import Program
from superopt.sgraph import (
    AccKind,
    BlockGraph,
    BlockInput,
    BlockOp,
    GraphKernel,
    Kernel,
    LibraryKernel,
    SGraph,
    SGraphError,
    check_matches,
)

_UNARY = (Op.EXP, Op.NEG, Op.SQRT, Op.SQUARE, Op.SILU, Op.SIGMOID, Op.RELU)  # in the order mutants are named
_SWAP_REDUCE: dict[str, Op] = {Op.SUM: Op.MEAN, Op.MEAN: Op.SUM, Op.MAX: Op.SUM}
_INSERTED = (Op.NEG, Op.SQUARE, Op.EXP, Op.SQRT)


def mutants(sg: SGraph, program: Program) -> list[tuple[str, SGraph]]:
    """Well-formed variants of `sg` (each differing in one place), with a description each."""
    seen = {sg.dumps()}
    out: list[tuple[str, SGraph]] = []
    for what, kernels in _variants(sg):
        cand = SGraph(sg.inputs, kernels, sg.outputs, f"{sg.name}~{len(out)}")
        try:
            check_matches(cand, program)
        except (SGraphError, ValueError):
            continue
        text = cand.dumps().replace(cand.name, sg.name)
        if text in seen:
            continue
        seen.add(text)
        out.append((what, cand))
    return out


def _with_kernel(sg: SGraph, i: int, k: Kernel) -> tuple[Kernel, ...]:
    return (*sg.kernels[:i], k, *sg.kernels[i + 1 :])


def _variants(sg: SGraph) -> Iterator[tuple[str, tuple[Kernel, ...]]]:
    for i, k in enumerate(sg.kernels):
        if isinstance(k, LibraryKernel):
            for what, nk in _library_variants(k):
                yield f"kernel {k.id}: {what}", _with_kernel(sg, i, nk)
            continue
        for what, block in _block_variants(sg, k):
            yield f"kernel {k.id}: {what}", _with_kernel(sg, i, GraphKernel(k.id, block))


def _library_variants(k: LibraryKernel) -> Iterator[tuple[str, LibraryKernel]]:
    for other in _alternatives(k.op):
        yield f"{k.op} -> {other}", replace(k, op=other)
    if len(k.inputs) == 2:
        yield "operands swapped", replace(k, inputs=(k.inputs[1], k.inputs[0]))


def _alternatives(op: str) -> list[Op]:
    for group in (ops.BINARY, _UNARY):
        if op in group:
            return [o for o in group if o != op][:3]
    return [_SWAP_REDUCE[op]] if op in _SWAP_REDUCE else []


def _block_variants(sg: SGraph, k: GraphKernel) -> Iterator[tuple[str, BlockGraph]]:
    b = k.block
    rank = {i.id: len(sg.info.shapes[i.tensor]) for i in b.inputs}
    for n, inp in enumerate(b.inputs):
        def with_input(n: int = n, inp: BlockInput = inp, **changes: object) -> BlockGraph:
            ins = list(b.inputs)
            ins[n] = replace(inp, **changes)  # type: ignore[arg-type]
            return replace(b, inputs=tuple(ins))

        for a, d in enumerate(inp.imap):
            for d2 in [None, *range(rank[inp.id])]:
                if d2 != d:
                    imap = list(inp.imap)
                    imap[a] = d2
                    what = "replicated instead of split" if d2 is None else f"split on dim {d2}"
                    yield f"input {inp.id} axis {b.grid[a].name} {what} (was {d})", with_input(imap=tuple(imap))
        for f2 in [None, *range(rank[inp.id])]:
            if f2 != inp.fmap:
                yield f"input {inp.id} fmap {inp.fmap} -> {f2}", with_input(fmap=f2)
    for n, acc in enumerate(b.accumulators):
        kinds: list[tuple[str, int | None]] = [(kind, None) for kind in (AccKind.SUM, AccKind.MEAN) if kind != acc.kind]
        if acc.kind != AccKind.CONCAT:
            kinds += [(AccKind.CONCAT, d) for d in range(len(sg.info.blocks[k.id].shapes[acc.source]))]
        for kind, dim in kinds:
            accs = list(b.accumulators)
            accs[n] = replace(acc, kind=kind, dim=dim)
            yield f"accumulator {acc.id} {acc.kind} -> {kind}", replace(b, accumulators=tuple(accs))
    for n, out in enumerate(b.outputs):
        for a in range(len(out.omap)):
            for d2 in range(len(sg.info.blocks[k.id].shapes[out.source])):
                if d2 != out.omap[a]:
                    omap = list(out.omap)
                    omap[a] = d2
                    outs = list(b.outputs)
                    outs[n] = replace(out, omap=tuple(omap))
                    yield f"output {out.tensor} omap axis {b.grid[a].name} -> dim {d2}", replace(b, outputs=tuple(outs))
    for phase in ("body", "post"):
        ops_ = getattr(b, phase)
        for n, op in enumerate(ops_):
            for what, new in _op_variants(op):
                changed = list(ops_)
                changed[n] = new
                yield f"{phase} op {op.id}: {what}", with_ops(b, phase, changed)
            if op.inputs:
                yield f"{phase} op {op.id} ({op.op}) dropped", _drop(b, phase, n)
            for extra in _INSERTED:
                yield f"{extra} inserted after {phase} op {op.id}", _insert_after(b, phase, n, extra)
            for j, src in enumerate(op.inputs):
                for other in _same_shape(sg, k, src, phase):
                    changed = list(ops_)
                    ins = list(op.inputs)
                    ins[j] = other
                    changed[n] = replace(op, inputs=tuple(ins))
                    yield f"{phase} op {op.id} reads {other} instead of {src}", with_ops(b, phase, changed)
    for n, acc in enumerate(b.accumulators):
        for other in _same_shape(sg, k, acc.source, "body"):
            accs = list(b.accumulators)
            accs[n] = replace(acc, source=other)
            yield f"accumulator {acc.id} reads {other} instead of {acc.source}", replace(b, accumulators=tuple(accs))
    for n, out in enumerate(b.outputs):
        for other in _same_shape(sg, k, out.source, "post"):
            outs = list(b.outputs)
            outs[n] = replace(out, source=other)
            yield f"output {out.tensor} written from {other} instead of {out.source}", replace(b, outputs=tuple(outs))
    for inp in b.inputs:
        for extra in _INSERTED:
            new = BlockOp(f"{inp.id}_m", extra, (inp.id,))
            fixed = rename_readers(b, inp.id, new.id)
            yield f"{extra} inserted after input {inp.id}", replace(fixed, body=(new, *fixed.body))
    for n, inp in enumerate(b.inputs):
        for t, shape in sg.info.shapes.items():
            if t != inp.tensor and shape == sg.info.shapes[inp.tensor] and sg.info.producer.get(t, "") != k.id:
                ins = list(b.inputs)
                ins[n] = replace(inp, tensor=t)
                yield f"input {inp.id} reads tensor {t} instead of {inp.tensor}", replace(b, inputs=tuple(ins))


def _same_shape(sg: SGraph, k: GraphKernel, tid: str, phase: str) -> list[str]:
    """Other block tensors visible to `phase` with the shape of `tid` (candidates for rewiring)."""
    info = sg.info.blocks[k.id]
    visible = ("input", "body") if phase == "body" else ("acc", "post")
    return [t for t in info.shapes if t != tid and info.phase[t] in visible and info.shapes[t] == info.shapes[tid]]


def _insert_after(b: BlockGraph, phase: str, n: int, op: Op) -> BlockGraph:
    """Insert `op` applied to op n's result; every reader of op n reads the new op instead."""
    ops_ = list(getattr(b, phase))
    target = ops_[n].id
    new = BlockOp(f"{target}_m", op, (target,))
    fixed = rename_readers(b, target, new.id)
    ops2 = list(getattr(fixed, phase))
    ops2.insert(n + 1, new)
    return with_ops(fixed, phase, ops2)


def rename_readers(b: BlockGraph, old: str, new: str) -> BlockGraph:
    """Every reader of block tensor `old` (ops, accumulators, outputs) reads `new` instead."""

    def fix(ids: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(new if i == old else i for i in ids)

    return replace(
        b,
        body=tuple(replace(o, inputs=fix(o.inputs)) for o in b.body),
        post=tuple(replace(o, inputs=fix(o.inputs)) for o in b.post),
        accumulators=tuple(replace(a, source=fix((a.source,))[0]) for a in b.accumulators),
        outputs=tuple(replace(o, source=fix((o.source,))[0]) for o in b.outputs),
    )


def _op_variants(op: BlockOp) -> Iterator[tuple[str, BlockOp]]:
    for other in _alternatives(op.op):
        yield f"{op.op} -> {other}", replace(op, op=other)
    if len(op.inputs) == 2 and op.op not in (Op.ADD, Op.MUL):
        yield "operands swapped", replace(op, inputs=(op.inputs[1], op.inputs[0]))
    if op.op in ops.REDUCE:
        yield "reduction dim changed", replace(op, attrs={**op.attrs, "dim": op.attrs["dim"] - 1})
    if op.op == Op.CONST:
        yield "constant changed", replace(op, attrs={"value": op.attrs["value"] * 2 + 1})


def _drop(b: BlockGraph, phase: str, n: int) -> BlockGraph:
    """Remove op n; its readers read its first operand instead."""
    gone = getattr(b, phase)[n]
    fixed = rename_readers(b, gone.id, gone.inputs[0])
    return with_ops(fixed, phase, [o for o in getattr(fixed, phase) if o.id != gone.id])


def with_ops(b: BlockGraph, phase: str, ops: Sequence[BlockOp]) -> BlockGraph:
    """`b` with its loop-body ("body") or post-loop ("post") ops replaced."""
    return replace(b, body=tuple(ops)) if phase == "body" else replace(b, post=tuple(ops))
