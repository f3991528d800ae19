"""The sGraph interpreter: executes an instantiated sGraph exactly as DESIGN.md §4 defines it.

Block by block and iteration by iteration: each input tile is the slice that the imap picks for
the block index and the fmap picks for the iteration; the body runs on the tiles; accumulators
combine iterations; post-loop ops run once per block; each output tile is written where the omap
puts the block. Output buffers start poisoned, so an element no block writes fails any
comparison. The interpreter is generic over an `ArrayAlgebra`: float arrays (with the storage
rounding of the sGraph's plan) or finite-field fingerprints.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from superopt.dtypes import dtype as get_dtype
from superopt.instantiate import Instance
from superopt.primitives import ArrayAlgebra, apply
from superopt.sgraph import GraphKernel, LibraryKernel


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


def input_index(
    full: Sequence[int], imap: Sequence[int | None], fmap: int | None, grid: Sequence[int], block: Sequence[int],
    loop: int, iteration: int,
) -> tuple[slice, ...]:
    """The slice of a tensor that block `block` reads at loop iteration `iteration`."""
    index = []
    for d, n in enumerate(full):
        start, width = 0, n
        for g, m, b in zip(grid, imap, block, strict=True):
            if m == d:
                width //= g
                start += b * width
        if fmap == d:
            width //= loop
            start += iteration * width
        index.append(slice(start, start + width))
    return tuple(index)


def output_index(tile: Sequence[int], omap: Sequence[int], block: Sequence[int]) -> tuple[slice, ...]:
    """Where block `block` writes its output tile."""
    index = [slice(0, n) for n in tile]
    for d, b in zip(omap, block, strict=True):
        index[d] = slice(b * tile[d], (b + 1) * tile[d])
    return tuple(index)


def run_block(inst: Instance, k: GraphKernel, tensors: Mapping[str, Any], alg: ArrayAlgebra[Any]) -> dict[str, Any]:
    b = k.block
    info = inst.sgraph.info.blocks[k.id]
    grid = inst.grid(k)
    loop = inst.loop(k)
    f32 = get_dtype("f32")
    outs = {o.tensor: alg.poison(inst.shape(o.tensor)) for o in b.outputs}
    tile = lambda tid: inst.tile(k.id, tid)

    def compute(op: Any, vals: dict[str, Any]) -> Any:
        out = apply(alg, op.op, [vals[i] for i in op.inputs], op.attrs, [tile(i) for i in op.inputs])
        return alg.round(out, _storage(info.storage[op.id]))

    for block in itertools.product(*(range(g) for g in grid)):
        partial: dict[str, Any] = {}
        for it in range(loop):
            vals: dict[str, Any] = {}
            for inp in b.inputs:
                full = inst.shape(inp.tensor)
                index = input_index(full, inp.imap, inp.fmap, grid, block, loop, it)
                vals[inp.id] = alg.take(tensors[inp.tensor], index)
            for op in b.body:
                vals[op.id] = compute(op, vals)
            for acc in b.accumulators:
                v = alg.round(vals[acc.source], f32)
                if acc.kind == "concat":
                    partial.setdefault(acc.id, []).append(v)
                else:
                    partial[acc.id] = v if it == 0 else alg.round(alg.add(partial[acc.id], v), f32)
        vals = {}
        for acc in b.accumulators:
            if acc.kind == "concat":
                assert acc.dim is not None
                vals[acc.id] = alg.concat(partial[acc.id], acc.dim)
            elif acc.kind == "mean":
                vals[acc.id] = alg.round(alg.div(partial[acc.id], alg.const(float(loop))), f32)
            else:
                vals[acc.id] = partial[acc.id]
        for op in b.post:
            vals[op.id] = compute(op, vals)
        for o in b.outputs:
            value = alg.round(vals[o.source], _storage(inst.sgraph.info.dtypes[o.tensor]))
            alg.put(outs[o.tensor], output_index(tile(o.source), o.omap, block), value)
    return outs


def run_float(inst: Instance, inputs: Mapping[str, Any], exact: bool = False) -> list[Any]:
    """Run on float arrays: exact float64, or the sGraph's dtype with its storage rounding."""
    from superopt.reference import FloatAlgebra

    sg = inst.sgraph
    dts = {t.dtype for t in sg.inputs}
    alg = FloatAlgebra(None if exact else get_dtype(dts.pop() if dts else "f32"))
    ins = {t.id: alg.round(alg.cast(inputs[t.id]), get_dtype(t.dtype)) for t in sg.inputs}
    return run(inst, ins, alg)
