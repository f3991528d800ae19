"""Readable text renderings of programs and sGraphs (for `superopt show` and reports)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from superopt.ops import Op, fmt_shape
from superopt.program import Program
from superopt.sgraph import BlockGraph, BlockOp, GraphKernel, LibraryKernel, SGraph


def _call(args: tuple[str, ...], attrs: Mapping[str, Any]) -> str:
    items = [*args, *(f"{k}={list(v) if isinstance(v, tuple) else v}" for k, v in attrs.items())]
    return "(" + ", ".join(items) + ")"


def render_program(p: Program) -> str:
    lines = [f"program {p.name}  hash {p.canonical_hash()[:16]}"]
    for n in p.topological():
        if n.op == "input":
            lines.append(f"  {n.id} = input {fmt_shape(n.shape)} {n.dtype}")
        elif n.op == Op.CONST:
            lines.append(f"  {n.id} = const {n.attrs['value']!r}")
        else:
            lines.append(f"  {n.id} = {n.op}{_call(n.inputs, n.attrs)}  {fmt_shape(n.shape)} {n.dtype}")
    lines.append(f"  outputs: {', '.join(p.outputs)}")
    return "\n".join(lines)


def _map_text(block: BlockGraph, dims: tuple[int | None, ...]) -> str:
    return ", ".join(f"{a.name}->{'-' if d is None else d}" for a, d in zip(block.grid, dims, strict=True))


def render_sgraph(sg: SGraph, values: Mapping[str, int] | None = None) -> str:
    info = sg.info
    ins = ", ".join(f"{t.id}{fmt_shape(t.shape)}:{t.dtype}" for t in sg.inputs)
    lines = [f"sGraph {sg.name}  ({ins})"]
    for k in sg.kernels:
        if isinstance(k, LibraryKernel):
            lines.append(
                f"kernel {k.id}  library {k.op}{_call(k.inputs, k.attrs)} -> {k.output} "
                f"{fmt_shape(info.shapes[k.output])}"
            )
            continue
        lines.extend(_render_graph_kernel(sg, k))
    lines.append(f"outputs: {', '.join(sg.outputs)}")
    cons = dict.fromkeys(str(c.expr) for c in info.constraints if c.kind == "divides" and not c.expr.is_const())
    if cons:
        lines.append("constraints: " + "; ".join(f"{c} integer" for c in cons))
    if values:
        lines.append("params: " + ", ".join(f"{k}={v}" for k, v in sorted(values.items())))
    return "\n".join(lines)


def _render_graph_kernel(sg: SGraph, k: GraphKernel) -> list[str]:
    b, bi = k.block, sg.info.blocks[k.id]
    grid = " ".join(f"{a.name}={a.size}" for a in b.grid)
    outs = ", ".join(k.outputs)
    lines = [f"kernel {k.id}  graph-defined  grid {grid}  loop {b.loop.name}={b.loop.size}  -> {outs}"]

    def tile(tid: str) -> str:
        where = bi.storage.get(tid)
        return f"{fmt_shape(bi.shapes[tid])}" + (f" [{where}]" if where else " [reg]")

    def op_line(tag: str, op: BlockOp) -> str:
        return f"  {tag:<5}{op.id} = {op.op}{_call(op.inputs, op.attrs)}  {tile(op.id)}"

    for i in b.inputs:
        fm = "-" if i.fmap is None else i.fmap
        lines.append(f"  in   {i.id} = {i.tensor}[imap {_map_text(b, i.imap)}; fmap {fm}]  {tile(i.id)}")
    lines.extend(op_line("body", op) for op in b.body)
    for a in b.accumulators:
        extra = f", dim={a.dim}" if a.dim is not None else ""
        lines.append(f"  acc  {a.id} = {a.kind}({a.source}{extra})  {tile(a.id)}")
    lines.extend(op_line("post", op) for op in b.post)
    for o in b.outputs:
        lines.append(
            f"  out  {o.tensor} <- {o.source}  [omap {_map_text(b, o.omap)}]  {fmt_shape(sg.info.shapes[o.tensor])}"
        )
    return lines
