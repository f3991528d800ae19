"""The sGraph interpreter: executes an instantiated sGraph exactly as DESIGN.md §4 defines it.

Iteration by iteration, for every block at once: each input tile is the slice that the imap picks
for the block index and the fmap picks for the iteration; the body runs on the tiles; accumulators
combine iterations; post-loop ops run once per block; each output tile is written where the omap
puts the block. Blocks share no state, so running them side by side (a value's leading dims are
the grid's) computes what running them one by one does. Output buffers start poisoned, so an
element no block writes fails any comparison. The interpreter is generic over an `ArrayAlgebra`:
float arrays (with the storage rounding of the sGraph's plan) or finite-field fingerprints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from superopt.dtypes import dtype as get_dtype
from superopt.instantiate import Instance
from superopt.primitives import ArrayAlgebra, apply
from superopt.sgraph import AccKind, GraphKernel, LibraryKernel


def run(inst: Instance, inputs: Mapping[str, Any], alg: ArrayAlgebra[Any]) -> list[Any]:
    """Run every kernel in order; returns the sGraph's outputs."""
    sg = inst.sgraph
    tensors: dict[str, Any] = {t.id: inputs[t.id] for t in sg.inputs}
    for k in sg.kernels:
        if isinstance(k, LibraryKernel):
            out = apply(alg, k.op, [tensors[i] for i in k.inputs], k.attrs, [inst.shape(i) for i in k.inputs])
            tensors[k.output] = alg.round(out, _storage(sg.info.dtypes.get(k.output)))
        else:
            tensors.update(run_block(inst, k, tensors, alg))
    return [tensors[o] for o in sg.outputs]


def _storage(name: str | None) -> Any:
    return get_dtype(name) if name else None


def run_block(inst: Instance, k: GraphKernel, tensors: Mapping[str, Any], alg: ArrayAlgebra[Any]) -> dict[str, Any]:
    """Every block at once: a value's leading dims are the grid axes (1 along an axis it does not
    vary with), then its tile's dims, so each op runs once per loop iteration for all blocks (one
    block at a time, the checks at real shapes ran thousands of tile matmuls in Python)."""
    b = k.block
    info = inst.sgraph.info.blocks[k.id]
    grid = tuple(inst.grid(k))
    loop = inst.loop(k)
    f32 = get_dtype("f32")
    tile = lambda tid: tuple(inst.tile(k.id, tid))
    lead: dict[str, tuple[int, ...]] = {}  # each value's grid dims

    def compute(op: Any, vals: dict[str, Any]) -> Any:
        tiles = [tile(i) for i in op.inputs]
        rank = max(map(len, tiles), default=0)
        lead[op.id] = tuple(max((lead[i][a] for i in op.inputs), default=1) for a in range(len(grid)))
        args = [_aligned(alg, vals[i], lead[i], t, rank) for i, t in zip(op.inputs, tiles, strict=True)]
        attrs = {**op.attrs, "dim": _shifted(op.attrs["dim"], grid)} if "dim" in op.attrs else op.attrs
        out = apply(alg, op.op, args, attrs, [(*lead[op.id], *(1,) * (rank - len(t)), *t) for t in tiles])
        return alg.round(out, _storage(info.storage[op.id]))

    partial: dict[str, Any] = {}
    for it in range(loop):
        vals: dict[str, Any] = {}
        for inp in b.inputs:
            lead[inp.id] = tuple(g if m is not None else 1 for g, m in zip(grid, inp.imap, strict=True))
            vals[inp.id] = _tiles(alg, tensors[inp.tensor], inst.shape(inp.tensor), inp.imap, inp.fmap, grid, loop, it)
        for op in b.body:
            vals[op.id] = compute(op, vals)
        for acc in b.accumulators:
            lead[acc.id] = lead[acc.source]
            v = alg.round(vals[acc.source], f32)
            if acc.kind == AccKind.CONCAT:
                partial.setdefault(acc.id, []).append(v)
            else:
                partial[acc.id] = v if it == 0 else alg.round(alg.add(partial[acc.id], v), f32)
    vals = {}
    for acc in b.accumulators:
        if acc.kind == AccKind.CONCAT:
            assert acc.dim is not None
            vals[acc.id] = alg.concat(partial[acc.id], _shifted(acc.dim, grid))
        elif acc.kind == AccKind.MEAN:
            vals[acc.id] = alg.round(alg.div(partial[acc.id], alg.const(float(loop))), f32)
        else:
            vals[acc.id] = partial[acc.id]
    for op in b.post:
        vals[op.id] = compute(op, vals)
    outs = {}
    for o in b.outputs:
        value = alg.round(vals[o.source], _storage(inst.sgraph.info.dtypes[o.tensor]))
        outs[o.tensor] = _assembled(alg, value, tile(o.source), o.omap, grid, inst.shape(o.tensor))
    return outs


def _shifted(dim: int, grid: Sequence[int]) -> int:
    """A tile dim among the dims of a value with grid dims first (negative ones count from the end)."""
    return dim + len(grid) if dim >= 0 else dim


def _aligned(alg: ArrayAlgebra[Any], value: Any, lead: tuple[int, ...], tile: tuple[int, ...], rank: int) -> Any:
    """`value` with unit dims between its grid dims and its tile's, up to `rank` tile dims: numpy
    broadcasts trailing dims, so an operand of a lower tile rank would meet grid dims."""
    return value if len(tile) == rank else alg.reshape(value, (*lead, *(1,) * (rank - len(tile)), *tile))


def _tiles(
    alg: ArrayAlgebra[Any], x: Any, full: Sequence[int], imap: Sequence[int | None], fmap: int | None,
    grid: Sequence[int], loop: int, it: int,
) -> Any:
    """Every block's tile of tensor `x` at loop iteration `it`, grid dims first. A dim split by grid
    axes and the loop is split grid-outer (in axis order), loop-inner (DESIGN.md §4): its extent
    is those factors and the tile's, in that order."""
    split: list[int] = []  # every dim cut into its factors
    index: list[slice] = []
    grid_at: dict[int, int] = {}  # grid axis -> where its factor is
    kept: list[int] = []  # where the loop's factor (one iteration of it) and each tile dim are
    widths: list[int] = []
    for d, n in enumerate(full):
        for a, m in enumerate(imap):
            if m == d:
                grid_at[a] = len(split)
                split.append(grid[a])
                index.append(slice(None))
                n //= grid[a]
        if fmap == d:
            kept.append(len(split))
            split.append(loop)
            index.append(slice(it, it + 1))
            n //= loop
        kept.append(len(split))
        split.append(n)
        index.append(slice(None))
        widths.append(n)
    picked = alg.take(alg.reshape(x, split), tuple(index))
    moved = alg.transpose(picked, [*(grid_at[a] for a in sorted(grid_at)), *kept])
    return alg.reshape(moved, [*(g if a in grid_at else 1 for a, g in enumerate(grid)), *widths])


def _assembled(
    alg: ArrayAlgebra[Any], value: Any, tile: tuple[int, ...], omap: Sequence[int], grid: Sequence[int],
    shape: Sequence[int],
) -> Any:
    """The output tensor holding every block's tile (`value`: grid dims, then the tile) where the
    omap puts it. Each grid axis sends blocks along a distinct dim (`SGraph` checks), so the tiles
    are disjoint; the buffer starts poisoned, so an element no block writes fails any comparison."""
    order: list[int] = []
    sizes: list[int] = []
    for d, t in enumerate(tile):
        axes = [a for a, m in enumerate(omap) if m == d]
        order += [*axes, len(grid) + d]
        sizes.append(t * math.prod(grid[a] for a in axes))
    blocks = alg.reshape(alg.transpose(alg.broadcast_to(value, (*grid, *tile)), order), sizes)
    out = alg.poison(shape)
    alg.put(out, tuple(slice(0, s) for s in sizes), blocks)
    return out


def run_float(inst: Instance, inputs: Mapping[str, Any], exact: bool = False) -> list[Any]:
    """Run on float arrays: exact float64, or the sGraph's dtype with its storage rounding."""
    from superopt.reference import FloatAlgebra

    sg = inst.sgraph
    dts = {t.dtype for t in sg.inputs}
    alg = FloatAlgebra(None if exact else get_dtype(dts.pop() if dts else "f32"))
    ins = {t.id: alg.round(alg.cast(inputs[t.id]), get_dtype(t.dtype)) for t in sg.inputs}
    return run(inst, ins, alg)
