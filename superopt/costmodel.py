"""The roofline cost model: estimated time of an instantiated sGraph on a target, without a GPU.

Per kernel: time = launch overhead + max(DRAM time, compute time, loop-latency time).
- DRAM bytes are what the schedule really moves: a graph-defined kernel reads each input tile once
  per block, and once per loop iteration when the loop walks that input (so a replicated input is
  re-read by every block); it writes each output element once. Library kernels read their inputs
  and write their output, so intermediates between them go through DRAM, at `LIBRARY_BANDWIDTH`
  of the peak. Narrow tile rows waste 32-byte DRAM sectors, which the model charges.
- Compute uses the tensor-core peak for f16/bf16 matmuls whose tiles are multiples of 16 (what
  WMMA takes) and the FP32 peak otherwise.
- Occupancy: DRAM bandwidth needs bandwidth x latency bytes in flight. Each resident block keeps
  at most `IN_FLIGHT_PER_BLOCK` bytes of its per-iteration tile loads in flight (its threads'
  outstanding loads; whole sectors, which a narrow row's load keeps busy too), and an SM holds
  as many blocks as shared memory and threads allow, so few blocks, small tiles or blocks too
  large for more than one per SM scale the achieved bandwidth down; fewer blocks than SMs scale
  compute down. Every loop iteration of a block costs about `ITERATION_LATENCY_S` (a tile load
  round trip and barriers), overlapped across the blocks resident on an SM (as many as shared
  memory and threads allow).
The physical floor of a program is its inputs read once plus outputs written once over bandwidth,
or its FLOPs over the tensor peak, whichever is larger.

A change to what the model estimates raises `targets.MODEL_REVISION`: cached winners it ranked
before answer no request after.

The formulas run on numpy columns: an Instance whose values are columns (`assignment_table`)
gets every assignment's estimate at once, which is how `rank` and `kernel_floors` use them;
`estimate` is the same code on one instantiation.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

from superopt.assignments import Table, assignment_table, divisors, enumerate_assignments
from superopt.assignments import candidates as divisor_candidates
from superopt.dtypes import dtype as get_dtype
from superopt.instantiate import Instance
from superopt.ops import ELEMENTWISE, LAYOUT, NORMALIZE, REDUCE, Op
from superopt.program import Program
from superopt.sgraph import GraphKernel, Kernel, LibraryKernel, SGraph, read_by_library, stored_order
from superopt.targets import Target

DRAM_LATENCY_S = 0.6e-6  # bytes in flight needed to saturate DRAM: bandwidth x this latency
IN_FLIGHT_PER_BLOCK = 16 * 1024  # 128 threads x 8 outstanding 16-byte loads
ITERATION_LATENCY_S = 0.7e-6  # a tile load's round trip plus the barriers of one loop iteration
LIBRARY_BANDWIDTH = 0.85  # fraction of peak DRAM bandwidth tuned library kernels sustain
MAX_THREADS_PER_SM = 2048
SECTOR_BYTES = 32

# FLOPs per output element of elementwise ops (transcendentals count several).
ELEMENT_FLOPS: dict[str, int] = {  # keyed by Op, read by any name
    Op.ADD: 1, Op.SUB: 1, Op.MUL: 1, Op.DIV: 1, Op.NEG: 1, Op.RELU: 1, Op.SQUARE: 1, Op.CONST: 0,
    Op.EXP: 4, Op.SQRT: 4, Op.RSQRT: 4, Op.SIGMOID: 6, Op.SILU: 7, Op.GELU: 15,
}
# FLOPs per input element of reductions and normalizations.
REDUCE_FLOPS: dict[str, int] = {Op.SUM: 1, Op.MEAN: 1, Op.MAX: 1, Op.RMS_NORM: 5, Op.SOFTMAX: 8}
assert set(ELEMENT_FLOPS) == {*ELEMENTWISE, Op.CONST} and set(REDUCE_FLOPS) == {*REDUCE, *NORMALIZE}


@dataclass
class KernelEstimate:
    kernel: str
    kind: str
    dram_bytes: int
    flops: int
    time_s: float
    bound: str  # "dram" | "compute" | "latency" | "launch" | "free"
    blocks: int = 0


@dataclass
class Estimate:
    kernels: list[KernelEstimate] = field(default_factory=list)

    @property
    def time_s(self) -> float:
        return sum(k.time_s for k in self.kernels)

    @property
    def time_us(self) -> float:
        return self.time_s * 1e6

    @property
    def dram_bytes(self) -> int:
        return sum(k.dram_bytes for k in self.kernels)

    @property
    def flops(self) -> int:
        return sum(k.flops for k in self.kernels)

    @property
    def launches(self) -> int:
        return sum(1 for k in self.kernels if k.bound != "free")


def op_flops(op: str, in_shapes: list[tuple[int, ...]], out_shape: tuple[int, ...]) -> int:
    if op == Op.MATMUL:
        a, b = in_shapes
        return 2 * math.prod(a[:-1]) * a[-1] * b[-1]
    if op in REDUCE_FLOPS:
        return REDUCE_FLOPS[op] * math.prod(in_shapes[0])
    if op in ELEMENT_FLOPS:
        return ELEMENT_FLOPS[op] * math.prod(out_shape)
    return 0  # layout ops move data, they compute nothing


def _matmul_peak(target: Target, dt: str, a: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
    if dt not in ("f16", "bf16"):
        return target.fp32_flops
    wmma = (a[-2] % 16 == 0) & (a[-1] % 16 == 0) & (b[-1] % 16 == 0)  # WMMA takes multiples of 16
    return np.where(wmma, target.tensor_flops, target.fp32_flops)


BOUNDS = ("dram", "compute", "latency", "launch", "free")  # what bounds a kernel's time
FREE_OPS = (Op.CONST, *LAYOUT)  # library kernels that cost nothing: a launch argument, views


@dataclass(frozen=True)
class _Costs:
    """One kernel's estimate at every assignment of an Instance whose values are numpy columns
    (or plain ints): each field a column, or a scalar where no symbol changes it."""

    kernel: str
    kind: str
    dram_bytes: Any
    flops: Any
    time_s: Any
    bound: Any  # index into BOUNDS
    blocks: Any = 0

    def at(self, i: int) -> KernelEstimate:
        def pick(x: Any) -> Any:
            return x[i] if np.ndim(x) else x

        return KernelEstimate(self.kernel, self.kind, int(pick(self.dram_bytes)), int(pick(self.flops)),
                              float(pick(self.time_s)), BOUNDS[int(pick(self.bound))], int(pick(self.blocks)))

    def times(self, rows: int) -> np.ndarray:
        return np.broadcast_to(self.time_s, (rows,))


def estimate(inst: Instance) -> Estimate:
    return Estimate([_costs(inst, k).at(0) for k in inst.sgraph.kernels])


def _costs(inst: Instance, k: Kernel) -> _Costs:
    return _library(inst, k) if isinstance(k, LibraryKernel) else _graph(inst, k)


def is_free(sg: SGraph, k: Kernel) -> bool:
    """A kernel that launches nothing: a constant, a view; a reshape of a transposed view copies
    unless only graph kernels read it (`SGraph.reshaped_views`)."""
    return isinstance(k, LibraryKernel) and k.op in FREE_OPS and not (
        sg.reshapes_view(k) and k.output not in sg.reshaped_views)


def _library(inst: Instance, k: LibraryKernel) -> _Costs:
    t = inst.target
    info = inst.sgraph.info
    if is_free(inst.sgraph, k):
        return _Costs(k.id, "library", 0, 0, 0.0, BOUNDS.index("free"))
    in_shapes = [inst.shape(i) for i in k.inputs]
    out_shape = inst.shape(k.output)
    nbytes = get_dtype(info.dtypes[k.output]).nbytes
    dram = sum(math.prod(s) for s in in_shapes if s) * nbytes + math.prod(out_shape) * nbytes
    flops = op_flops(k.op, in_shapes, out_shape)
    peak = _matmul_peak(t, info.dtypes[k.output], *in_shapes) if k.op == Op.MATMUL else t.fp32_flops
    t_dram, t_comp = dram / (t.dram_bytes_per_s * LIBRARY_BANDWIDTH), flops / peak
    body = np.maximum(t_dram, t_comp)
    bound = np.where(body < t.launch_overhead_s, BOUNDS.index("launch"),
                     np.where(t_dram >= t_comp, BOUNDS.index("dram"), BOUNDS.index("compute")))
    return _Costs(k.id, "library", dram, flops, t.launch_overhead_s + body, bound)


def _graph(inst: Instance, k: GraphKernel) -> _Costs:
    t = inst.target
    sg = inst.sgraph
    b = k.block
    grid = inst.grid(k)
    blocks, loop = math.prod(grid), inst.loop(k)
    dt = sg.info.dtypes[k.outputs[0]]
    nbytes = get_dtype(dt).nbytes
    dram_eff: Any = 0.0
    dram: Any = 0
    per_iteration: Any = 0  # DRAM bytes (whole sectors) a block loads in each loop iteration
    for inp in b.inputs:
        tile = inst.tile(k.id, inp.id)
        reads = blocks * loop if inp.fmap is not None else blocks
        loaded = math.prod(tile) * nbytes
        moved = loaded / _read_efficiency(inst, inp.tensor, tile, nbytes)
        dram = dram + reads * loaded
        dram_eff = dram_eff + reads * moved
        per_iteration = per_iteration + (moved if inp.fmap is not None else np.where(loop == 1, moved, 0))
    for o in b.outputs:
        moved = math.prod(inst.shape(o.tensor)) * nbytes
        dram = dram + moved
        dram_eff = dram_eff + moved / _sector_efficiency(_run(inst.tile(k.id, o.source), inst.shape(o.tensor)), nbytes)
    flops: Any = 0
    comp_s: Any = 0.0
    for phase, repeat in ((b.body, blocks * loop), (b.post, blocks)):
        for op in phase:
            ins = [inst.tile(k.id, i) for i in op.inputs]
            f = op_flops(op.op, ins, inst.tile(k.id, op.id)) * repeat
            peak = _matmul_peak(t, dt, *ins) if op.op == Op.MATMUL else t.fp32_flops
            flops = flops + f
            comp_s = comp_s + f / peak
    flops = flops + sum(math.prod(inst.tile(k.id, a.id)) for a in b.accumulators) * blocks * loop
    per_sm = np.maximum(1, np.minimum(MAX_THREADS_PER_SM // t.threads_per_block,
                                      t.smem_per_sm // np.maximum(inst.smem(k), 1)))
    active_sms = np.minimum(blocks, t.sms)
    bw_fraction = _bandwidth_fraction(t, blocks, per_sm, np.minimum(np.maximum(per_iteration, 1), IN_FLIGHT_PER_BLOCK))
    waves_fraction = _wave_quantization(blocks, t.sms * per_sm)
    t_dram = dram_eff / (t.dram_bytes_per_s * bw_fraction) * waves_fraction
    t_comp = comp_s / (active_sms / t.sms) * waves_fraction
    t_lat = _latency(t, blocks, loop, per_sm)
    parts = np.broadcast_arrays(t_dram, t_comp, t_lat)  # in BOUNDS order: ties go to the first
    return _Costs(k.id, "graph", dram, flops, t.launch_overhead_s + np.max(parts, axis=0),
                  np.argmax(parts, axis=0), blocks)


def _read_efficiency(inst: Instance, tensor: str, tile: tuple[Any, ...], nbytes: int) -> Any:
    """Fraction of each 32-byte DRAM sector that reading a tile of `tensor` uses: the contiguous
    runs of its memory. A view's are its stored tensor's (`SGraph.views`); a reshaped view's are
    its own, cut where the view it reshapes leaves its stored order (`SGraph.reshaped_views`)."""
    sg = inst.sgraph
    if tensor in sg.reshaped_views:
        view = sg.reshaped_views[tensor]
        perm, shape = sg.views[view][1], inst.shape(view)
        in_order = 1  # the view's trailing dims that keep the stored tensor's order
        for d in reversed(range(len(perm))):
            if perm[d] != d:
                break
            in_order *= shape[d]
        return _sector_efficiency(np.minimum(_run(tile, inst.shape(tensor)), in_order), nbytes)
    if tensor in sg.views:
        stored, perm = sg.views[tensor]
        return _sector_efficiency(_run(stored_order(tile, perm), inst.shape(stored)), nbytes)
    return _sector_efficiency(_run(tile, inst.shape(tensor)), nbytes)


def _run(tile: tuple[Any, ...], full: tuple[Any, ...]) -> Any:
    """Elements a tile holds contiguously in its row-major tensor: the trailing tile dims that
    span the whole tensor dim, times the first one that does not."""
    run: Any = 1
    spans: Any = True
    for t_d, f_d in zip(reversed(tile), reversed(full), strict=True):
        run = run * np.where(spans, t_d, 1)
        spans = spans & (t_d == f_d)
    return run


def _sector_efficiency(run: Any, nbytes: int) -> Any:
    """Fraction of each 32-byte DRAM sector that runs of `run` elements use."""
    return np.minimum(1.0, run * nbytes / SECTOR_BYTES)


def _wave_quantization(blocks: Any, concurrent: Any) -> Any:
    """Time of ceil(blocks / concurrent) full waves relative to perfectly divided work."""
    waves = blocks / concurrent
    return np.where(blocks <= concurrent, 1.0, np.ceil(waves) / waves)


@dataclass(frozen=True)
class Floor:
    dram_bytes: int
    flops: int
    time_s: float


def floor(program: Program, target: Target) -> Floor:
    """The physical floor: inputs read once plus outputs written once, or FLOPs at peak."""
    nbytes = {n.id: get_dtype(n.dtype or "f32").nbytes for n in program.nodes.values()}
    dram = sum(math.prod(n.shape) * nbytes[n.id] for n in program.inputs)
    dram += sum(math.prod(program.nodes[o].shape) * nbytes[o] for o in program.outputs)
    flops = 0
    for n in program.nodes.values():
        if n.op not in ("input", Op.CONST):
            flops += op_flops(n.op, [program.nodes[i].shape for i in n.inputs], n.shape)
    time_s = max(dram / target.dram_bytes_per_s, flops / target.tensor_flops)
    return Floor(dram, flops, time_s)


def rank(
    sg: SGraph, target: Target, candidates: Mapping[str, list[int]] | None = None, keep: int = 5,
    deadline: float | None = None,
) -> list[tuple[dict[str, int], Estimate]]:
    """The `keep` valid assignments of an sGraph's symbols with the lowest estimated time, best
    first (ties broken by the values, so the choice is deterministic).

    A kernel's estimate depends only on the symbols in its axes and tensor shapes, so each kernel
    is estimated once per distinct value of those symbols, not once per full assignment; the
    enumeration has already checked every constraint. `deadline` (wall-clock time.time()) stops
    early with the best found so far."""
    relevant = {k.id: _kernel_symbols(sg, k) for k in sg.kernels}
    # Kernels that share no symbol (directly or through a constraint) are independent: the best
    # assignment combines each group's best, so each group is ranked on its own symbols.
    groups = _symbol_groups(sg, relevant)
    ranked_groups = [_rank_group(sg, target, candidates, keep, deadline, g, relevant) for g in groups]
    combined: list[tuple[float, dict[str, int], dict[str, KernelEstimate]]] = [(0.0, {}, {})]
    for options in ranked_groups:
        if not options:
            return []
        combined = heapq.nsmallest(
            keep,
            ((t + t2, {**v, **v2}, {**e, **e2}) for t, v, e in combined for t2, v2, e2 in options),
            key=lambda x: (x[0], tuple(sorted(x[1].items()))),
        )
    return [(values, Estimate([ests[k.id] for k in sg.kernels])) for _, values, ests in combined]


def _symbol_groups(sg: SGraph, relevant: Mapping[str, list[str]]) -> list[tuple[list[str], frozenset[str]]]:
    """(kernel ids, symbols) of each group of kernels connected by shared symbols."""
    kernel_syms = {k: set(s) for k, s in relevant.items()}
    for c in sg.info.constraints:
        kernel_syms[c.kernel] |= c.expr.symbols
    groups: list[tuple[list[str], set[str]]] = []
    for k in (k.id for k in sg.kernels):
        mine = kernel_syms[k]
        joined = [g for g in groups if g[1] & mine]
        merged = ([k], set(mine))
        for g in joined:
            groups.remove(g)
            merged = (g[0] + merged[0], g[1] | merged[1])
        groups.append(merged)
    return [(ks, frozenset(s)) for ks, s in groups]


def _rank_group(
    sg: SGraph, target: Target, candidates: Mapping[str, list[int]] | None, keep: int, deadline: float | None,
    group: tuple[list[str], frozenset[str]], relevant: Mapping[str, list[str]],
) -> list[tuple[float, dict[str, int], dict[str, KernelEstimate]]]:
    """The best assignments of one group's symbols. Symbols that several of its kernels share (a
    merge kernel's loop tied to the chunks of the kernel before it) are enumerated; given their
    values, each kernel's own symbols are ranked alone (variable elimination)."""
    kernel_ids, symbols = group
    kernels = [k for k in sg.kernels if k.id in kernel_ids]
    cands = dict(candidates or divisor_candidates(sg))
    own = {k.id: _own_symbols(sg, k, relevant[k.id]) for k in kernels}
    shared = frozenset(s for s in symbols if sum(s in own[k.id] for k in kernels) > 1)

    ranked: dict[str, tuple[Table, _Costs, np.ndarray, np.ndarray]] = {}

    def kernel_best(k: Kernel, fixed: Mapping[str, int]) -> list[tuple[float, dict[str, int], KernelEstimate]]:
        """The `keep` fastest assignments of k's symbols given the shared ones. Every shared value
        is estimated at once: k's table spans the shared symbols, each value selects its rows."""
        if k.id not in ranked:
            table = assignment_table(sg, target, cands, symbols=own[k.id] | shared)
            costs = _costs(Instance(sg, table.columns, target), k)
            times = costs.times(table.rows)
            # best first, ties broken by the values in symbol order (np.lexsort: last key first)
            order = np.lexsort([*(table.columns[s] for s in sorted(table.columns, reverse=True)), times])
            ranked[k.id] = (table, costs, times, order)
        table, costs, times, order = ranked[k.id]
        match = np.ones(table.rows, dtype=bool)
        for s, v in fixed.items():
            match &= table.columns[s] == v
        return [(float(times[i]), table.row(i), costs.at(i)) for i in order[match[order]][:keep]]

    out: list[tuple[float, dict[str, int], dict[str, KernelEstimate]]] = []
    for fixed in enumerate_assignments(sg, target, cands, symbols=shared):
        combined: list[tuple[float, dict[str, int], dict[str, KernelEstimate]]] = [(0.0, dict(fixed), {})]
        for k in kernels:
            options = kernel_best(k, fixed)
            if not options:
                combined = []
                break
            combined = heapq.nsmallest(
                keep,
                ((t + t2, {**v, **v2}, {**e, k.id: e2}) for t, v, e in combined for t2, v2, e2 in options),
                key=lambda x: (x[0], tuple(sorted(x[1].items()))),
            )
        out = heapq.nsmallest(keep, [*out, *combined], key=lambda x: (x[0], tuple(sorted(x[1].items()))))
        if deadline is not None and out and time.time() > deadline:
            break
    return out


def kernel_floors(
    sg: SGraph, target: Target, kernel: Kernel, candidates: Mapping[str, list[int]], by: str | None = None,
) -> dict[int, float]:
    """The least estimated time of one kernel of `sg` for each value of the symbol `by` (one of
    the kernel's own; without it, one entry, 0), over every assignment (from `candidates`) of the
    symbols its estimate depends on that meets the constraints on those symbols alone; empty when
    none does. A lower bound of the kernel's share of any instantiation of `sg`. A kernel whose
    outputs are per-chunk partials shares its chunk count with the kernel that merges them, so
    its cost is compared per count. A reshape of a view is free where only graph kernels read it
    (`SGraph.reshaped_views`): 0 unless a library kernel of `sg` reads it."""
    if sg.reshapes_view(kernel) and not read_by_library(sg.kernels, kernel.output):
        return {0: 0.0}
    symbols = _own_symbols(sg, kernel, _kernel_symbols(sg, kernel))
    table = assignment_table(sg, target, candidates, symbols=symbols)
    if not table.rows:
        return {}
    times = _costs(Instance(sg, table.columns, target), kernel).times(table.rows)
    if by is None:
        return {0: float(times.min())}
    at = table.columns[by]
    return {v: float(times[at == v].min()) for v in sorted(set(at.tolist()))}  # np.unique imports numpy.ma: 30 ms


def whole_reduction_floor(
    target: Target, inputs: Sequence[tuple[float, frozenset[int]]], output_bytes: float,
    axes: Sequence[tuple[frozenset[int], int]], max_grid: int, loop: int = 1,
) -> float:
    """The least time `_graph` gives any graph kernel that reads `inputs` (bytes, program dim
    classes of its dims) and writes `output_bytes`, when each of its at most `max_grid` grid axes
    is one of `axes` (the program dim classes it splits, side by side when more than one, and
    their size, which the axis size divides; listed twice, one may serve two axes): a kernel with no
    per-chunk partial results, whose grid splits only classes of its outputs. Known before its
    block graph is: every block reads its tile of each input over its loop (of at least `loop`
    iterations), split only by the axes over that input's classes, so an input lacking an output
    class is read again by every block along it. Compute, sector waste, waves and shared memory
    only add to `_graph`'s time; a block keeps at most `IN_FLIGHT_PER_BLOCK` bytes in flight and
    an SM holds at most its thread limit's blocks, and DRAM takes at least `_dram_latency_floor`."""
    options = sorted(axes, key=lambda a: (sorted(a[0]), a[1]))
    per_sm = _most_resident(target)
    best = math.inf
    for chosen in combinations(options, min(max_grid, len(options))):
        values = np.meshgrid(*(np.array(divisors(size), dtype=np.float64) for _, size in chosen), indexing="ij")
        split = [(classes, v.ravel()) for (classes, _), v in zip(chosen, values, strict=True)]
        blocks = math.prod((g for _, g in split), start=np.ones(1))
        dram = output_bytes + sum(
            nbytes * blocks / math.prod((g for c, g in split if c & classes), start=np.ones(1))
            for nbytes, classes in inputs)
        t_dram = dram / (target.dram_bytes_per_s * _bandwidth_fraction(target, blocks, per_sm, IN_FLIGHT_PER_BLOCK))
        t_dram = np.maximum(t_dram, _dram_latency_floor(loop))
        best = min(best, float(np.min(np.maximum(t_dram, _latency(target, blocks, loop, per_sm)))))
    return target.launch_overhead_s + best


def iteration_floor(target: Target, block_counts: Sequence[int]) -> float:
    """The least time `_graph` charges per loop iteration of a graph kernel with one of these
    block counts (its loop latency, or `_dram_latency_floor`): a kernel that walks c chunks in its
    loop takes at least c times this."""
    latency = np.min(_latency(target, np.array(block_counts, dtype=np.float64), 1, _most_resident(target)))
    return max(float(latency), _dram_latency_floor(1))


def _dram_latency_floor(loop: int) -> float:
    """The least DRAM time `_graph` gives a graph kernel whose loop walks an input over `loop`
    iterations (or has one iteration): a block has in flight at most what it loads per iteration,
    so the blocks' loads in flight are at most the bytes read over `loop`, and below
    bandwidth x `DRAM_LATENCY_S` the bandwidth reached scales down with them: reading them takes
    at least `loop` latencies, however few they are."""
    return loop * DRAM_LATENCY_S


def _most_resident(target: Target) -> int:
    """Blocks an SM can hold at most (its thread limit; shared memory can only lower it)."""
    return max(1, MAX_THREADS_PER_SM // target.threads_per_block)


def _latency(target: Target, blocks: Any, loop: Any, per_sm: Any) -> Any:
    """Loop latency: each iteration of a block costs `ITERATION_LATENCY_S`, overlapped across the
    blocks resident on an SM (at most `per_sm`)."""
    resident = np.minimum(per_sm, -(-blocks // target.sms))
    return blocks * loop / (np.minimum(blocks, target.sms) * resident) * ITERATION_LATENCY_S


def _bandwidth_fraction(target: Target, blocks: Any, per_sm: Any, in_flight_per_block: Any) -> Any:
    """Fraction of DRAM bandwidth reached: bandwidth x latency bytes must be in flight, from the
    blocks resident at once."""
    in_flight = np.minimum(blocks, target.sms * per_sm) * in_flight_per_block
    return np.minimum(1.0, in_flight / (target.dram_bytes_per_s * DRAM_LATENCY_S))


def _own_symbols(sg: SGraph, k: Kernel, relevant: list[str]) -> frozenset[str]:
    """The symbols a kernel's estimate depends on, with those of its own constraints."""
    return frozenset(relevant) | frozenset(s for c in sg.info.constraints if c.kernel == k.id for s in c.expr.symbols)


def best_params(sg: SGraph, target: Target) -> dict[str, int]:
    """The valid assignment with the lowest estimated time, over every divisor of every split."""
    best = rank(sg, target, keep=1)
    if not best:
        raise ValueError(f"sGraph {sg.name}: no assignment of its symbols meets the constraints on {target.name}")
    return best[0][0]


def _kernel_symbols(sg: SGraph, k: GraphKernel | LibraryKernel) -> list[str]:
    info = sg.info
    sizes = [d for t in (*k.tensor_inputs, *k.outputs) for d in info.shapes[t]]
    if isinstance(k, GraphKernel):
        sizes += [a.size for a in k.block.axes]
        sizes += [d for shape in info.blocks[k.id].shapes.values() for d in shape]
    return sorted({sym for size in sizes for sym in size.symbols})
