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
  outstanding loads), and an SM holds as many blocks as shared memory and threads allow, so few
  blocks, small tiles or blocks too large for more than one per SM scale the achieved bandwidth
  down; fewer blocks than SMs scale compute down. Every loop iteration of a
  block costs about `ITERATION_LATENCY_S` (a tile load round trip and barriers), overlapped across
  the blocks resident on an SM (as many as shared memory and threads allow).
The physical floor of a program is its inputs read once plus outputs written once over bandwidth,
or its FLOPs over the tensor peak, whichever is larger.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from superopt.assignments import candidates as divisor_candidates
from superopt.assignments import enumerate_assignments
from superopt.dtypes import dtype as get_dtype
from superopt.instantiate import Instance
from superopt.program import Program
from superopt.sgraph import GraphKernel, Kernel, LibraryKernel, SGraph
from superopt.targets import Target

DRAM_LATENCY_S = 0.6e-6  # bytes in flight needed to saturate DRAM: bandwidth x this latency
IN_FLIGHT_PER_BLOCK = 16 * 1024  # 128 threads x 8 outstanding 16-byte loads
ITERATION_LATENCY_S = 0.7e-6  # a tile load's round trip plus the barriers of one loop iteration
LIBRARY_BANDWIDTH = 0.85  # fraction of peak DRAM bandwidth tuned library kernels sustain
MAX_THREADS_PER_SM = 2048
SECTOR_BYTES = 32

# FLOPs per output element of elementwise ops (transcendentals count several).
ELEMENT_FLOPS = {
    "add": 1, "sub": 1, "mul": 1, "div": 1, "neg": 1, "relu": 1, "square": 1, "const": 0,
    "exp": 4, "sqrt": 4, "rsqrt": 4, "sigmoid": 6, "silu": 7, "gelu": 15,
}
# FLOPs per input element of reductions and normalizations.
REDUCE_FLOPS = {"sum": 1, "mean": 1, "max": 1, "rms_norm": 5, "softmax": 8}


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
    if op == "matmul":
        a, b = in_shapes
        return 2 * math.prod(a[:-1]) * a[-1] * b[-1]
    if op in REDUCE_FLOPS:
        return REDUCE_FLOPS[op] * math.prod(in_shapes[0])
    if op in ELEMENT_FLOPS:
        return ELEMENT_FLOPS[op] * math.prod(out_shape)
    return 0  # layout ops move data, they compute nothing


def _matmul_peak(target: Target, dt: str, a: tuple[int, ...], b: tuple[int, ...]) -> float:
    tensor = dt in ("f16", "bf16") and all(d % 16 == 0 for d in (a[-2], a[-1], b[-1]))
    return target.tensor_flops if tensor else target.fp32_flops


def estimate(inst: Instance) -> Estimate:
    est = Estimate()
    for k in inst.sgraph.kernels:
        est.kernels.append(_library(inst, k) if isinstance(k, LibraryKernel) else _graph(inst, k))
    return est


def _library(inst: Instance, k: LibraryKernel) -> KernelEstimate:
    t = inst.target
    info = inst.sgraph.info
    if k.op == "const" or k.op == "reshape":
        return KernelEstimate(k.id, "library", 0, 0, 0.0, "free")  # a launch argument / a view
    in_shapes = [inst.shape(i) for i in k.inputs]
    out_shape = inst.shape(k.output)
    nbytes = get_dtype(info.dtypes[k.output]).nbytes
    dram = sum(math.prod(s) for s in in_shapes if s) * nbytes + math.prod(out_shape) * nbytes
    flops = op_flops(k.op, in_shapes, out_shape)
    peak = _matmul_peak(t, info.dtypes[k.output], *in_shapes) if k.op == "matmul" else t.fp32_flops
    t_dram, t_comp = dram / (t.dram_bytes_per_s * LIBRARY_BANDWIDTH), flops / peak
    body = max(t_dram, t_comp)
    bound = "dram" if t_dram >= t_comp else "compute"
    if body < t.launch_overhead_s:
        bound = "launch"
    return KernelEstimate(k.id, "library", dram, flops, t.launch_overhead_s + body, bound)


def _graph(inst: Instance, k: GraphKernel) -> KernelEstimate:
    t = inst.target
    sg = inst.sgraph
    b = k.block
    grid = inst.grid(k)
    blocks, loop = math.prod(grid), inst.loop(k)
    dt = sg.info.dtypes[k.outputs[0]]
    nbytes = get_dtype(dt).nbytes
    dram_eff = 0.0
    dram = 0
    per_iteration = 0  # bytes a block loads in each loop iteration
    for inp in b.inputs:
        tile = inst.tile(k.id, inp.id)
        reads = blocks * (loop if inp.fmap is not None else 1)
        moved = reads * math.prod(tile) * nbytes
        dram += moved
        dram_eff += moved / _sector_efficiency(tile, inst.shape(inp.tensor), nbytes)
        if inp.fmap is not None or loop == 1:
            per_iteration += math.prod(tile) * nbytes
    for o in b.outputs:
        moved = math.prod(inst.shape(o.tensor)) * nbytes
        dram += moved
        dram_eff += moved / _sector_efficiency(inst.tile(k.id, o.source), inst.shape(o.tensor), nbytes)
    flops, comp_s = 0, 0.0
    for phase, repeat in ((b.body, blocks * loop), (b.post, blocks)):
        for op in phase:
            ins = [inst.tile(k.id, i) for i in op.inputs]
            f = op_flops(op.op, ins, inst.tile(k.id, op.id)) * repeat
            peak = _matmul_peak(t, dt, *ins) if op.op == "matmul" else t.fp32_flops
            flops += f
            comp_s += f / peak
    flops += sum(math.prod(inst.tile(k.id, a.id)) for a in b.accumulators) * blocks * loop
    per_sm = max(1, min(MAX_THREADS_PER_SM // t.threads_per_block, t.smem_per_sm // max(inst.smem(k), 1)))
    resident = min(per_sm, math.ceil(blocks / t.sms))
    active_sms = min(blocks, t.sms)
    in_flight = min(blocks, t.sms * per_sm) * min(max(per_iteration, 1), IN_FLIGHT_PER_BLOCK)
    bw_fraction = min(1.0, in_flight / (t.dram_bytes_per_s * DRAM_LATENCY_S))
    waves_fraction = _wave_quantization(blocks, t.sms * per_sm)
    t_dram = dram_eff / (t.dram_bytes_per_s * bw_fraction) * waves_fraction
    t_comp = comp_s / (active_sms / t.sms) * waves_fraction
    t_lat = blocks * loop / (active_sms * resident) * ITERATION_LATENCY_S
    parts = {"dram": t_dram, "compute": t_comp, "latency": t_lat}
    bound = max(parts, key=lambda p: parts[p])
    return KernelEstimate(k.id, "graph", dram, flops, t.launch_overhead_s + parts[bound], bound, blocks)


def _sector_efficiency(tile: tuple[int, ...], full: tuple[int, ...], nbytes: int) -> float:
    """Fraction of each 32-byte DRAM sector that a tile's contiguous runs use.

    A run is the trailing tile dims that span the whole tensor dim, times the first one that
    does not: the bytes one block touches without a gap."""
    run = 1
    for t_d, f_d in zip(reversed(tile), reversed(full), strict=True):
        run *= t_d
        if t_d != f_d:
            break
    return min(1.0, run * nbytes / SECTOR_BYTES)


def _wave_quantization(blocks: int, concurrent: int) -> float:
    """Time of ceil(blocks / concurrent) full waves relative to perfectly divided work."""
    if blocks <= concurrent:
        return 1.0
    waves = blocks / concurrent
    return math.ceil(waves) / waves


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
        if n.op not in ("input", "const"):
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
    cache: dict[tuple[str, tuple[tuple[str, int], ...]], KernelEstimate] = {}
    clock = [0]

    def expired() -> bool:
        clock[0] += 1
        return deadline is not None and clock[0] % 256 == 0 and time.time() > deadline

    def kernel_best(k: Kernel, fixed: Mapping[str, int]) -> list[tuple[float, dict[str, int], KernelEstimate]]:
        pinned = {**cands, **{s: [v] for s, v in fixed.items()}}
        scored: list[tuple[float, dict[str, int], KernelEstimate]] = []
        for values in enumerate_assignments(sg, target, pinned, symbols=own[k.id] | frozenset(fixed)):
            if expired() and scored:
                break
            key = (k.id, tuple((s, values[s]) for s in relevant[k.id]))
            if key not in cache:
                inst = Instance(sg, values, target)
                cache[key] = _library(inst, k) if isinstance(k, LibraryKernel) else _graph(inst, k)
            scored.append((cache[key].time_s, values, cache[key]))
        return heapq.nsmallest(keep, scored, key=lambda e: (e[0], tuple(sorted(e[1].items()))))

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
        if expired() and out:
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
    its cost is compared per count."""
    symbols = _own_symbols(sg, kernel, _kernel_symbols(sg, kernel))
    estimate = _library if isinstance(kernel, LibraryKernel) else _graph
    floors: dict[int, float] = {}
    for values in enumerate_assignments(sg, target, candidates, symbols=symbols):
        at = values[by] if by is not None else 0
        time_s = estimate(Instance(sg, values, target), kernel).time_s  # type: ignore[arg-type]
        if time_s < floors.get(at, math.inf):
            floors[at] = time_s
    return floors


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
