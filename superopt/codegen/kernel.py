"""Assemble one graph-defined kernel: stages in block-graph order, barriers where they are needed.

Order (DESIGN.md §4 semantics): zero the sum/mean accumulators and load the loop-invariant input
tiles; then per iteration load the tiles the loop walks, run the body, fold into accumulators;
after the loop finish means, run the post-loop ops and store the outputs. A `__syncthreads()` goes
before a stage that reads a tile written since the last barrier, or writes one read or written
since then; the end of every iteration has one, since the next iteration overwrites the tiles.
"""

from __future__ import annotations

from collections.abc import Sequence

from superopt import ops
from superopt.codegen.context import KernelContext
from superopt.codegen.names import comment_text
from superopt.codegen.program import THREADS_PER_BLOCK, CodegenError
from superopt.codegen.stages import (
    Stage,
    accumulate,
    elementwise,
    finish_mean,
    indent,
    load,
    matmul,
    normalization,
    reduction,
    store,
    zero,
)
from superopt.ops import Op
from superopt.sgraph import AccKind, Accumulator, BlockOp

BARRIER = "__syncthreads();"
# Occupancy promised to ptxas: 2 blocks of 128 threads leave it up to 255 registers per thread,
# so it never spills to meet a register target it picked by heuristics.
MIN_BLOCKS_PER_SM = 2


class _Barriers:
    """Tracks tiles written / read since the last barrier."""

    def __init__(self) -> None:
        self.dirty: set[str] = set()
        self.read: set[str] = set()

    def emit(self, stages: Sequence[Stage]) -> list[str]:
        lines: list[str] = []
        for st in stages:
            if st.reads & self.dirty or st.writes & (self.dirty | self.read):
                lines.append(BARRIER)
                self.clear()
            lines.append(f"// {comment_text(st.comment)}")
            lines += st.lines
            self.dirty |= st.writes
            self.read |= st.reads
        return lines

    def pending(self) -> bool:
        return bool(self.dirty or self.read)

    def clear(self) -> None:
        self.dirty.clear()
        self.read.clear()


def _op_stage(ctx: KernelContext, op: BlockOp, accs: list[Accumulator]) -> Stage | None:
    if ctx.storage(op.id) is None and op.op != Op.MATMUL:
        return None  # recomputed in registers by its consumers (thread-level fusion)
    if op.op == Op.MATMUL:
        targets = [a for a in accs if a.source == op.id] if ctx.storage(op.id) is None else []
        return matmul(ctx, op, targets)
    if op.op in ops.ELEMENTWISE or op.op == Op.CONST:
        return elementwise(ctx, op)
    if op.op in ops.REDUCE:
        return reduction(ctx, op)
    if op.op in ops.NORMALIZE:
        return normalization(ctx, op)
    raise CodegenError(f"kernel {ctx.k.id}: no code generation for block op {op.op!r}")


def kernel_source(ctx: KernelContext) -> tuple[str, bool]:
    """The `__global__` function's source, and whether it uses tensor cores."""
    b = ctx.block
    accs = list(b.accumulators)
    matmuls = {op.id: op for op in b.ops() if op.op == Op.MATMUL}
    fed_by_matmul = {a.id for a in accs if a.source in matmuls and ctx.storage(a.source) is None}
    pre = [zero(ctx, a) for a in accs if a.kind in (AccKind.SUM, AccKind.MEAN)]
    pre += [load(ctx, i) for i in b.inputs if i.fmap is None]
    body = [load(ctx, i) for i in b.inputs if i.fmap is not None]
    body += [s for op in b.body if (s := _op_stage(ctx, op, accs)) is not None]
    body += [accumulate(ctx, a) for a in accs if a.id not in fed_by_matmul]  # the matmul adds into those
    post = [finish_mean(ctx, a) for a in accs if a.kind == AccKind.MEAN]
    post += [s for op in b.post if (s := _op_stage(ctx, op, accs)) is not None]
    post += [store(ctx, o) for o in b.outputs]
    wmma = any(ctx.wmma(op) for op in matmuls.values())

    bar = _Barriers()
    lines = bar.emit(pre)
    if bar.pending():
        lines.append(BARRIER)
        bar.clear()
    loop_lines = bar.emit(body)
    bar.clear()
    lines += [f"for (int {ctx.loop_var} = 0; {ctx.loop_var} < {ctx.loop}; ++{ctx.loop_var}) {{",
              *indent(loop_lines), f"  {BARRIER}  // the next iteration overwrites this one's tiles", "}"]
    lines += bar.emit(post)
    return _function(ctx, lines, wmma), wmma


def _function(ctx: KernelContext, lines: list[str], wmma: bool) -> str:
    k = ctx.k
    params = [(f"const {ctx.gtype(t)}* __restrict__ {ctx.gname(t)}", t) for t in k.tensor_inputs]
    params += [(f"{ctx.gtype(t)}* __restrict__ {ctx.gname(t)}", t) for t in k.outputs]
    head = [
        f'extern "C" __global__ void __launch_bounds__({THREADS_PER_BLOCK}, {MIN_BLOCKS_PER_SM}) {ctx.name}(',
        *(f"    {p}{',' if i < len(params) - 1 else ') {'}  // {comment_text(t)}" for i, (p, t) in enumerate(params)),
    ]
    total = sum(s.nbytes for s in ctx.slots)
    decl = [f"extern __shared__ __align__(128) unsigned char so_smem[];  // {total} bytes, per the storage plan"]
    for s in ctx.slots:
        ct = ctx.ctype(s.tensor)
        shape = " x ".join(map(str, s.shape)) or "scalar"
        decl.append(f"{ct}* const {ctx.smem(s.tensor)} = reinterpret_cast<{ct}*>(so_smem + {s.offset});"
                    f"  // {comment_text(s.tensor)}: {shape} {s.dtype}")
    decl.append("const int tid = threadIdx.x;")
    if wmma:
        decl.append("const int warp = tid / 32;")
    for axis, dim in zip(ctx.block.grid, "xyz", strict=False):
        decl.append(f"const int {ctx.axis_vars[axis.name]} = blockIdx.{dim};  // {comment_text(axis.name)}")
    return "\n".join([*head, *indent(decl), *indent(lines), "}"]) + "\n"
