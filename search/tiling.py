"""Tilings: `resolve` turns a complete block graph (`search.block`) into graph kernels with concrete
maps: grid axes split classes present in every output (all of them, up to three: an axis of size 1
is always available to the instantiation, so splitting more dominates splitting less) or, side by
side, one class of each output (the columns of X @ Wq and of X @ Wk), optionally one more axis
splits a reduced class (its outputs become per-chunk partial results, merged by a later kernel
whose loop is tied to that axis), and the loop walks a set of reduced classes. A per-axis
linearity analysis keeps only tilings that compute the same values as the untiled block graph (a
sum of per-tile partial sums is the sum; a product of partial sums is not) and chooses each
accumulator: sum or mean where the loop's class was reduced, mean for values the loop does not
change. (A value the loop splits is not accumulated: concatenating its slices, which the sGraph IR
allows, splits what the grid splits better, and measured on the workloads it only cost states.)
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import combinations, product

from superopt import ops
from superopt.build import BlockBuilder
from superopt.dimclasses import NO_CLASS
from superopt.object_cache import ObjectCache
from superopt.ops import Op
from superopt.search.block import CHAIN, UNIT, BlockState, InputSpec, Tile
from superopt.sgraph import GraphKernel
from superopt.sizes import Size
from superopt.verifier.oracle import AE

Sink = tuple[AE, tuple[Size, ...], tuple[int, ...]]  # a block output: expression, full shape, program dim classes
# Per-axis status of a tile: how it relates to the axis' split (see `_statuses`).
NONE, SPLIT, SUM, MEAN, BAD = "none", "split", "sum", "mean", "bad"


@dataclass(frozen=True)
class Chunk:
    """A kernel tensor dim that concatenates per-chunk partial results along a grid axis."""

    dim: int
    axis: str
    size: Size
    kind: str  # "sum" | "mean": how the chunks merge
    base: int  # the dim's size per chunk


@dataclass
class Resolved:
    kernel: GraphKernel
    outputs: list[tuple[str, int, Chunk | None]]  # (kernel tensor id, tile index, chunk)


@dataclass
class Axis:
    name: str
    size: Size
    classes: frozenset[int]
    partial: bool = False


def resolve(
    s: BlockState, inputs: Sequence[InputSpec], tensor_ids: Sequence[str], kid: str, index: int,
    tie: tuple[str, Size] | None, plans: Plans, max_grid: int = 3, partial_axes: bool = True,
) -> Iterator[Resolved]:
    """Every valid tiling of a complete block graph, as graph kernels with symbolic sizes; the
    tilings found are kept in `plans`, the caller's (`Plans`)."""
    letters = "xyz"
    key = (len(inputs), tie is not None, max_grid, partial_axes)
    for plan in plans.get(s, key, lambda: list(_search_plans(s, *key))):
        axes = [Axis(f"g{letters[i]}{index}", Size.sym(f"g{letters[i]}{index}") if classes else Size.const(1),
                     classes, partial) for i, (classes, partial) in enumerate(plan.axes)]
        yield _built(s, inputs, tensor_ids, kid, index, axes, tie, None, plan)


def axis_options(s: BlockState) -> list[frozenset[int]]:
    """Every grid axis a tiling of this complete block graph (no tied loop) may take, as the block
    dim classes it splits (`_search_plans` chooses up to `max_grid` of them): a class of every
    output, classes side by side, a reduced class split into per-chunk partials, and, when no
    class of every output can be split, the axis of a single block (no class). Known before the
    tilings are searched, for a floor of them all (`Floors.tiled_floor`)."""
    parallel, _, partial = _Analysis(s).axes()
    return [*parallel, *(frozenset({c}) for c in partial)] + ([] if parallel else [frozenset()])


def splittable_classes(s: BlockState) -> frozenset[int]:
    """The program dim classes that a grid axis over one block class may split in some block graph
    completing `s` (a loop body with its accumulators): later ops add tiles and may unify classes
    of `s`, but never change the statuses of its tiles (`_statuses`), so a program class that
    leaves a tile of `s` `bad` however many of its block classes the axis spans (an rms_norm's
    dim, a dim summed inside an exp) is split by no such axis. Side-by-side axes are not covered
    (a split of a second class may make a tile valid again). Known before the post-loop graphs
    are generated, for a floor of them all (`Floors.body_floor`)."""
    root_dims = [tuple(s.classes.find(d) for d in t.dims) for t in s.tiles]
    roots: dict[int, set[int]] = {}
    for dims in root_dims:
        for r in dims:
            if r != UNIT:
                roots.setdefault(s.classes.program[r], set()).add(r)
    return frozenset(p for p, rs in roots.items() if any(
        _statuses(s, frozenset(spans), root_dims, None, False) is not None
        for n in range(1, len(rs) + 1) for spans in combinations(sorted(rs), n)))


class _Analysis:
    """What every tiling of a complete block graph starts from: its outputs, each tile's root
    classes, and the statuses of the tiles per axis (`_statuses`, memoized)."""

    def __init__(self, s: BlockState) -> None:
        cl = s.classes
        self.outs = [k for k, t in enumerate(s.tiles) if t.phase == 1 and not _consumed(s, k)]
        self.root_dims = [tuple(cl.find(d) for d in t.dims) for t in s.tiles]
        self.input_classes = {c for k, t in enumerate(s.tiles) if t.op == "input" for c in self.root_dims[k]
                              if c != UNIT}
        self.tied_classes = {self.root_dims[k][d] for k, d in s.tied if self.root_dims[k][d] != UNIT}
        self.in_all_outputs = set.intersection(*(set(self.root_dims[o]) - {UNIT} for o in self.outs))
        self.status = _StatusMemo(s, self.root_dims)
        self.s = s

    def splits(self, axis: frozenset[int], want: tuple[str, ...]) -> bool:
        """A grid axis may split these classes: every tile stays computable and the outputs are `want`."""
        st = self.status(axis, is_loop=False)
        return st is not None and all(st[o] in want for o in self.outs)

    def axes(self) -> tuple[list[frozenset[int]], list[int], list[int]]:
        """The axes that split the outputs (a class of each, or side by side), the reduced classes
        (inputs have them, not every output), and those of them an axis may split into partials."""
        parallel = [frozenset({c}) for c in sorted((self.in_all_outputs & self.input_classes) - self.tied_classes)
                    if self.splits(frozenset({c}), (SPLIT,))]
        reduced = sorted(self.input_classes - self.in_all_outputs - self.tied_classes)
        parallel += [a for a in _side_by_side(self.s, self.root_dims, self.outs, set(reduced))
                     if self.splits(a, (SPLIT,))]
        return parallel, reduced, [c for c in reduced if self.splits(frozenset({c}), (SUM, MEAN))]


def _search_plans(s: BlockState, n_inputs: int, tied: bool, max_grid: int, partial_axes: bool) -> Iterator[_Plan]:
    an = _Analysis(s)
    root_dims, outs, status = an.root_dims, an.outs, an.status
    parallel, reduced, splittable_reduced = an.axes()
    loop_options: list[frozenset[int]]
    if tied:
        loop_options = [frozenset({-2})]  # the tied loop: walks the tied input dims
    else:  # a loop walks at most one dim of each input (`_plan`): no other subset is tried
        input_dims = [set(root_dims[k]) for k in range(n_inputs)]
        loop_options = [frozenset(c) for r in range(len(reduced) + 1) for c in combinations(reduced, r)
                        if all(len(dims.intersection(c)) <= 1 for dims in input_dims)]
    partial_options = [()] + ([(c,) for c in splittable_reduced] if partial_axes else [])
    for loop in loop_options:
        for partial in partial_options:
            room = max_grid - len(partial)
            if room < 0:
                continue
            for par in _widest(parallel, room):
                if not par and not partial:
                    if not parallel and (single := _single_block(s, n_inputs, loop, tied, root_dims, outs, status)):
                        yield single
                    continue
                axes = (*((a, False) for a in par), *((frozenset({c}), True) for c in partial))
                plan = _plan(s, n_inputs, axes, loop, tied, root_dims, outs, status)
                if plan is not None:
                    yield plan


def _single_block(
    s: BlockState, n_inputs: int, loop: frozenset[int], tied: bool, root_dims: list[tuple[int, ...]],
    outs: list[int], status: _StatusMemo,
) -> _Plan | None:
    """The tiling of a block graph whose outputs leave no class to split (a reduction of every
    dim: `sum(sum(X))`, or of two different ones: softmax after an rms_norm over the other dim):
    one block, on a grid axis of size 1 that splits nothing (the sGraph IR wants one), walking
    the loop. (Where some class could be split, an axis of size 1 over it stands for this.)"""
    plan = _plan(s, n_inputs, (), loop, tied, root_dims, outs, status)
    if plan is None or any(not root_dims[o] for o in outs):
        return None  # a rank-0 output has no dim for the axis to map to
    return _Plan(((frozenset(), False),), plan.loop, [[None]] * n_inputs, plan.fmaps, plan.acc_kind, plan.outs,
                 [[0]] * len(outs), plan.chunks)


def _side_by_side(
    s: BlockState, root_dims: list[tuple[int, ...]], outs: list[int], candidates: set[int],
) -> list[frozenset[int]]:
    """Grid axes over independent outputs side by side (X @ Wq and X @ Wk, split along their
    columns by one axis: a fused projection): one class of each output, none of them in every
    output, each standing for a program dim class of one block input only (its own weight's:
    what the search's floors assume, `Floors.middle_own`), all of one size, or of sizes
    with a common divisor over 1 when each is the column class of a product (the axis size
    divides each: grouped-query attention's K and V projections are narrower than Q's, their
    tiles too). Other outputs of different sizes are left apart: the norms of attention's Q and K
    side by side add many states before the winner, for no better schedule."""
    cl = s.classes
    owners: dict[int, int] = {}
    for k, t in enumerate(s.tiles):
        if t.op == "input":
            for pc in {cl.program[c] for c in root_dims[k] if c != UNIT} - {NO_CLASS}:
                owners[pc] = owners.get(pc, 0) + 1
    own = {c for c in candidates if owners.get(cl.program[c]) == 1}
    choices = [sorted({c for c in root_dims[o] if c in own}) for o in outs]
    products = {root_dims[k][-1] for k, t in enumerate(s.tiles) if t.op == Op.MATMUL}  # classes of their columns
    found: list[frozenset[int]] = []
    for pick in product(*choices):
        axis = frozenset(pick)
        sizes = {cl.size[c] for c in axis}
        if len(axis) > 1 and (len(sizes) == 1 or (axis <= products and math.gcd(*sizes) > 1)) and axis not in found:
            found.append(axis)
    return found


def _widest(options: list[frozenset[int]], room: int) -> list[tuple[frozenset[int], ...]]:
    """The sets of at most `room` grid axes, no two splitting one class, that no other option can
    join: an axis of size 1 stays available to the instantiation, so splitting more dominates
    splitting less. (In the order of `combinations` when the options are disjoint.)"""
    found: list[tuple[frozenset[int], ...]] = []

    def grow(chosen: tuple[frozenset[int], ...], i: int) -> None:
        taken = frozenset().union(*chosen)
        if i == len(options):
            if len(chosen) == room or all(o & taken for o in options):
                found.append(chosen)
            return
        if len(chosen) < room and not options[i] & taken:
            grow((*chosen, options[i]), i + 1)
        grow(chosen, i + 1)

    grow((), 0)
    return found


def resolve_fixed(
    s: BlockState, inputs: Sequence[InputSpec], tensor_ids: Sequence[str], kid: str, index: int,
    axes: Sequence[tuple[frozenset[int], int]], loop: tuple[frozenset[int], int],
) -> Resolved | None:
    """The one tiling that concrete (Mirage-style) search fixed before generating the block graph:
    each grid axis (program dim classes, side by side when more; size) and the loop (program dim
    classes, range). An axis over one class of no output splits partial results."""
    an = _Analysis(s)
    roots = {r for dims in an.root_dims for r in dims if r != UNIT}

    def block_classes(program_classes: frozenset[int]) -> frozenset[int]:
        return frozenset(r for r in roots if s.classes.program[r] in program_classes)

    letters = "xyz"
    fixed = []
    for i, (pcs, size) in enumerate(axes):
        classes = block_classes(pcs)
        fixed.append(Axis(f"g{letters[i]}{index}", Size.const(size), classes,
                          len(pcs) == 1 and not classes & an.in_all_outputs))
    loop_classes = block_classes(loop[0])
    return _tiling(s, inputs, tensor_ids, kid, index, fixed, loop_classes, loop[1], None, an.root_dims, an.outs,
                   an.status)


def sinks(block: BlockState) -> list[Sink]:
    """The abstract expression, full shape and program dim classes of each block output (its
    unconsumed post tiles)."""
    used = {a for t in block.tiles for a in t.args}
    return [(t.ae, output_shape(block, k, None), t.pdims) for k, t in enumerate(block.tiles)
            if t.phase == 1 and k not in used]


def output_shape(block: BlockState, tile: int, chunk: Chunk | None) -> tuple[Size, ...]:
    """The shape of the kernel tensor a block output is written to: full sizes, a chunked dim as
    many times its size per chunk as there are chunks."""
    dims = block.tiles[tile].dims
    shape = [Size.const(1 if d < 0 else block.classes.size[block.classes.find(d)]) for d in dims]
    if chunk is not None:
        shape[chunk.dim] = Size.const(chunk.base) * chunk.size
    return tuple(shape)


def _consumed(s: BlockState, k: int) -> bool:
    return any(k in t.args for t in s.tiles)


def _tiling(
    s: BlockState, inputs: Sequence[InputSpec], tensor_ids: Sequence[str], kid: str, index: int,
    axes: list[Axis], loop: frozenset[int], loop_size: int | None, tie: tuple[str, Size] | None,
    root_dims: list[tuple[int, ...]], outs: list[int], status: _StatusMemo,
) -> Resolved | None:
    """Build the graph kernel for one choice of grid axes and loop, if the linearity analysis
    allows it. `loop_size` is the concrete loop range, or None for a symbol."""
    plan = _plan(s, len(inputs), tuple((ax.classes, ax.partial) for ax in axes), loop, tie is not None,
                 root_dims, outs, status)
    return None if plan is None else _built(s, inputs, tensor_ids, kid, index, axes, tie, loop_size, plan)


def _built(
    s: BlockState, inputs: Sequence[InputSpec], tensor_ids: Sequence[str], kid: str, index: int,
    axes: list[Axis], tie: tuple[str, Size] | None, loop_size: int | None, plan: _Plan,
) -> Resolved:
    """The graph kernel of a plan, named for its place (kernel id, axis names, tensors)."""
    chunks = [None if c is None else Chunk(c[0], axes[c[1]].name, axes[c[1]].size, c[2], c[3]) for c in plan.chunks]
    return _build(s, inputs, tensor_ids, kid, axes, tie, plan.loop if tie is None else None, loop_size,
                  plan.imaps, plan.fmaps, plan.acc_kind, plan.outs, plan.omaps, chunks, index)


@dataclass(frozen=True)
class _Plan:
    """A valid tiling of a block graph, before names: the grid axes (the classes each splits,
    and whether it is a partial-result axis), the loop, and the maps and accumulators they imply.
    A chunk is (dim, grid axis position, "sum" | "mean", size per chunk)."""

    axes: tuple[tuple[frozenset[int], bool], ...]
    loop: frozenset[int]
    imaps: list[list[int | None]]
    fmaps: list[int | None]
    acc_kind: dict[int, tuple[str, int | None]]
    outs: list[int]
    omaps: list[list[int]]
    chunks: list[tuple[int, int, str, int] | None]


# The tilings of block graphs, by state object: a block space replayed after another kernel-level
# state resolves the same graphs again (after each first kernel, a middle kernel's); only the
# names differ.
Plans = ObjectCache[BlockState, list[_Plan]]
PLAN_ENTRIES = 1 << 17  # block graphs whose tilings are kept (the block spaces of the memo hold them anyway)


def _plan(
    s: BlockState, n_inputs: int, axes: tuple[tuple[frozenset[int], bool], ...], loop: frozenset[int],
    tied: bool, root_dims: list[tuple[int, ...]], outs: list[int], status: _StatusMemo,
) -> _Plan | None:
    """The linearity analysis of one choice of grid axes and loop: its plan, or None when some
    tile would not be computable per block (or the tiling repeats another's work)."""
    # Inputs: imap and fmap (before the statuses, which cost far more and which a tiling these
    # rule out never needs: an input walked along two dims, an axis that splits no input).
    imaps: list[list[int | None]] = []
    fmaps: list[int | None] = []
    for k in range(n_inputs):
        dims = root_dims[k]
        imap: list[int | None] = []
        for classes, _ in axes:
            hits = [d for d, c in enumerate(dims) if c in classes]
            if len(hits) > 1:
                return None
            imap.append(hits[0] if hits else None)
        walked = [d for (t, d) in s.tied if t == k] if tied else [d for d, c in enumerate(dims) if c in loop]
        if len(walked) > 1:
            return None
        imaps.append(imap)
        fmaps.append(walked[0] if walked else None)
    for a in range(len(axes)):
        if all(imaps[k][a] is None for k in range(n_inputs)):
            return None  # an axis that splits no input computes the same tile in every block
    looping = tied or bool(loop)
    if looping and all(f is None for f in fmaps):
        return None
    if not looping and any(t.phase == 1 and t.op != "acc" for t in s.tiles):
        return None  # without a loop the body/post split means nothing: the all-body form stands for it
    grid_status = [status(classes, is_loop=False) for classes, _ in axes]
    if tied:
        loop_status = status(frozenset(), is_loop=True, tied=True)
    elif loop:
        loop_status = status(loop, is_loop=True)
    else:
        loop_status = None
    if any(st is None for st in grid_status) or (loop_status is None and (loop or tied)):
        return None
    # Accumulators.
    acc_kind: dict[int, tuple[str, int | None]] = {}
    for k, t in enumerate(s.tiles):
        if t.op != "acc":
            continue
        src = t.args[0]
        if not looping:
            acc_kind[k] = ("sum", None)
            continue
        assert loop_status is not None
        st = loop_status[src]
        if st in (SUM, MEAN):
            acc_kind[k] = (st, None)
        elif st == NONE:
            acc_kind[k] = ("mean", None)
        else:
            return None
    # Outputs: omaps and chunks.
    omaps: list[list[int]] = []
    chunks: list[tuple[int, int, str, int] | None] = []
    for o in outs:
        dims = root_dims[o]
        omap: list[int] = []
        chunk: tuple[int, int, str, int] | None = None
        for a, (classes, partial) in enumerate(axes):
            st = grid_status[a][o]  # type: ignore[index]
            if st == SPLIT and not partial:
                hits = [d for d, c in enumerate(dims) if c in classes]
                if len(hits) != 1:
                    return None
                omap.append(hits[0])
            elif st in (SUM, MEAN) and partial:
                free = [d for d in range(len(dims)) if d not in omap]
                taken = {h for other, other_partial in axes if not other_partial
                         for h in [d for d, c in enumerate(dims) if c in other]}
                free = [d for d in free if d not in taken]
                if not free:
                    return None
                omap.append(free[-1])
                base = s.classes.size[dims[free[-1]]] if dims[free[-1]] != UNIT else 1
                chunk = (free[-1], a, st, base)
            else:
                return None
        omaps.append(omap)
        chunks.append(chunk)
    return _Plan(axes, loop, imaps, fmaps, acc_kind, list(outs), omaps, chunks)


class _StatusMemo:
    """`_statuses` of one block graph per axis: resolving it tries many combinations of axes."""

    def __init__(self, s: BlockState, root_dims: list[tuple[int, ...]]) -> None:
        self.s, self.root_dims = s, root_dims
        self.memo: dict[tuple[frozenset[int], bool, bool], list[str] | None] = {}

    def __call__(self, axis: frozenset[int], is_loop: bool, tied: bool = False) -> list[str] | None:
        key = (axis, is_loop, tied)
        if key not in self.memo:
            self.memo[key] = _statuses(self.s, axis, self.root_dims, set(self.s.tied) if tied else None, is_loop)
        return self.memo[key]


def _statuses(
    s: BlockState, axis: frozenset[int], root_dims: list[tuple[int, ...]], tied: set[tuple[int, int]] | None,
    is_loop: bool,
) -> list[str] | None:
    """Per tile: how it relates to an axis that splits `axis` classes (or walks the tied dims).

    none: does not depend on the split; split: a slice along the axis; sum / mean: a partial
    sum / mean over the axis' slices; a tiling is invalid as soon as a tile would be `bad` (a
    value that no combination of per-slice values gives, e.g. a product of partial sums)."""
    st: list[str] = []
    for k, t in enumerate(s.tiles):
        if t.op == "input":
            if tied is not None:
                st.append(SUM if any(i == k for i, _ in tied) else NONE)
            else:
                st.append(SPLIT if any(c in axis for c in root_dims[k]) else NONE)
            continue
        a = [st[x] for x in t.args]
        if t.op == "acc" and is_loop:
            st.append(NONE if a[0] != BAD else BAD)  # the accumulator completes the loop
        elif sum(c in axis for c in root_dims[k]) > 1:
            return None  # two dims sliced by one index: a diagonal block, no slice of the value
        else:
            st.append(_status(t, a, root_dims, axis))
        if st[-1] == BAD:
            return None
    return st


def _status(t: Tile, a: list[str], root_dims: list[tuple[int, ...]], axis: frozenset[int]) -> str:
    if t.op == CHAIN:
        return _chain_status(t, a, root_dims, axis)
    op = t.op
    if op == "acc":
        return a[0]
    if t.consts:
        x = a[0]
        if x not in (SUM, MEAN):
            return x
        # Scaling a partial sum by a constant keeps it a partial sum; anything else does not.
        return x if op == Op.MUL or (op == Op.DIV and t.consts[0][0] == 1) else BAD
    if op in ops.UNARY:
        x = a[0]
        if x in (SUM, MEAN):
            return x if op == Op.NEG else BAD
        return x
    if op in ops.REDUCE:
        x = a[0]
        d = dict(t.attrs)["dim"]
        src = root_dims[t.args[0]]
        if x == SPLIT and src[d] in axis:
            return {Op.SUM: SUM, Op.MEAN: MEAN}.get(op, BAD)
        if x in (SUM, MEAN) and op == Op.MAX:
            return BAD
        return x
    if op in ops.NORMALIZE:
        x = a[0]
        d = dict(t.attrs)["dim"]
        if x == SPLIT and root_dims[t.args[0]][d] in axis:
            return BAD
        return BAD if x in (SUM, MEAN) else x
    if op == Op.MATMUL:
        x, y = a
        left = root_dims[t.args[0]]
        if x == SPLIT and left[-1] in axis:
            return SUM if y == SPLIT else BAD
        if x in (SUM, MEAN) and y == NONE:
            return x
        if y in (SUM, MEAN) and x == NONE:
            return y
        if x in (SUM, MEAN) or y in (SUM, MEAN):
            return BAD
        return SPLIT if SPLIT in (x, y) else NONE
    # elementwise binary
    x, y = a
    if x in (SUM, MEAN) or y in (SUM, MEAN):
        if op in (Op.ADD, Op.SUB):
            return x if x == y else BAD
        if op == Op.MUL:
            if x in (SUM, MEAN) and y == NONE:
                return x
            if y in (SUM, MEAN) and x == NONE:
                return y
            return BAD
        if op == Op.DIV:
            return x if x in (SUM, MEAN) and y == NONE else BAD
    return SPLIT if SPLIT in (x, y) else NONE


def _chain_status(t: Tile, a: list[str], root_dims: list[tuple[int, ...]], axis: frozenset[int]) -> str:
    """A chain's status: its elementwise ops' in turn (no statuses of theirs read dims)."""
    status = a[0]
    for op, refs, consts in dict(t.attrs)["ops"]:
        step = Tile(op, (), (), t.phase, t.dims, t.ae, t.pdims, consts=consts)
        status = _status(step, [status if r < 0 else a[r] for r in refs], root_dims, axis)
        if status == BAD:
            return BAD
    return status


def _build(
    s: BlockState, inputs: Sequence[InputSpec], tensor_ids: Sequence[str], kid: str, axes: list[Axis],
    tie: tuple[str, Size] | None, loop: frozenset[int] | None, loop_size: int | None,
    imaps: list[list[int | None]], fmaps: list[int | None], acc_kind: dict[int, tuple[str, int | None]],
    outs: list[int], omaps: list[list[int]], chunks: list[Chunk | None], index: int,
) -> Resolved:
    if tie is not None:
        loop_axis: tuple[str, Size | int] = (tie[0], tie[1])
    elif loop:
        loop_axis = (f"F{index}", Size.sym(f"F{index}") if loop_size is None else loop_size)
    else:
        loop_axis = (f"F{index}", 1)
    kb = BlockBuilder(kid, [(ax.name, ax.size) for ax in axes], loop_axis)
    names: dict[int, str] = {}
    const_ids: dict[tuple[int, float], str] = {}

    def const(phase: int, value: float) -> str:
        """The block's constant of this value in this phase (made once)."""
        cid = const_ids.get((phase, value))
        if cid is None:
            adder = kb.op if phase == 0 else kb.after
            cid = const_ids[(phase, value)] = adder(Op.CONST, name=f"c{len(const_ids)}", value=value)
        return cid

    for k, t in enumerate(s.tiles):
        if t.op == "input":
            spec = inputs[k]
            names[k] = kb.input(tensor_ids[spec.tensor], imaps[k], fmaps[k], name=f"in{k}")
            continue
        args = [names[a] for a in t.args]
        adder = kb.op if t.phase == 0 else kb.after
        if t.op == CHAIN:  # its ops in turn, the last one named as the tile
            steps = dict(t.attrs)["ops"]
            value = ""
            for n, (op, refs, consts) in enumerate(steps):
                operands = [value if r < 0 else args[r] for r in refs]
                for pos, c in consts:
                    operands.insert(pos, const(t.phase, c))
                value = adder(op, *operands, name=f"v{k}" if n == len(steps) - 1 else f"v{k}_{n}")
            names[k] = value
            continue
        for pos, value in t.consts:
            args.insert(pos, const(t.phase, value))
        if t.op == "acc":
            kind, dim = acc_kind[k]
            names[k] = kb.acc(args[0], kind, dim, name=f"a{k}")
            continue
        names[k] = adder(t.op, *args, name=f"v{k}", **dict(t.attrs))
    outputs: list[tuple[str, int, Chunk | None]] = []
    for j, (o, omap, chunk) in enumerate(zip(outs, omaps, chunks, strict=True)):
        tid = f"{kid}_out{j}"
        kb.output(names[o], tid, omap)
        outputs.append((tid, o, chunk))
    return Resolved(kb.kernel(), outputs)
