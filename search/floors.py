"""Branch and bound for the kernel-level search: what a partial kernel graph must still compute,
read and write, and the least time any graph containing it can take.

`Floors`, which a `KernelSearch` holds, never grows a state: it answers, for a state, which
program outputs are missing and which tensors a later kernel must read (`missing`, `unused`,
`_left_to_read`), the least estimated time of its kernels (`spent`: launches and bytes at full
bandwidth, or the cost model's least estimate of each kernel over every size its symbols can take),
and of the kernels to come: a last library or graph kernel (`last_kernel_floor`, `_whole_floor`),
a middle kernel and what must follow it (`middle_floor`; over program inputs only, once known, the
least time of the kernels it can be, `middle_least`; `_last_after`, `_after_middle`), the
merge of per-chunk partials (`merged_later`), a kernel completing a loop body (`body_floor`), and
in a narrow dtype the kernels to come as paths over the program values they may store
(`paths_floor`, `paths_after`: `search.paths`). The search cuts a state whose floor exceeds the
bound (`bound_s`: the best proved candidates' time).
First kernels computing the same values are ranked by their floors, and those that others beat are
dropped (`undominated`).
Every floor is below the cost model's estimate of every graph it stands for: a cut never loses a
candidate that could win.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from itertools import combinations, product
from typing import Any

from superopt import costmodel, ops
from superopt.assignments import bounded_candidates, divisors
from superopt.config import MAX_OUTPUTS, SearchConfig
from superopt.dimclasses import NO_CLASS, dim_classes, input_classes
from superopt.dtypes import dtype as get_dtype
from superopt.object_cache import BoundedDict, ObjectCache
from superopt.ops import Op
from superopt.program import Node, Program
from superopt.search.block import BlockState
from superopt.search.fingerprint import fingerprint, random_inputs
from superopt.search.paths import ValuePaths
from superopt.search.space import Space
from superopt.search.states import FirstKernel, KState, KTensor, input_leaves
from superopt.search.tiling import axis_options, sinks, splittable_classes
from superopt.search.views import ProgramViews
from superopt.sgraph import GraphKernel, Kernel, LibraryKernel, SGraph, SGraphError, input_decls, read_by_library
from superopt.sizes import Size
from superopt.targets import Target
from superopt.verifier.oracle import AE, RESHAPED, C, Oracle, abstract_program

TIE = 1e-9  # relative difference of estimates below which two are the same (float sums differ in order)
FLOOR_ENTRIES = 1 << 17  # kernels, and sets of kernels, whose least estimated times are kept


class Floors:
    """The bounds of a `KernelSearch`, which holds one (its `floors`): the program's facts they
    read and the memos they keep. The search sets `bound_s` and `keep`; `pruned`, `bounded` and
    `cuts` count what the bound cut (`cut`)."""

    def __init__(self, program: Program, space: Space, oracle: Oracle, config: SearchConfig, target: Target | None,
                 views: ProgramViews | None, paths: ValuePaths | None = None) -> None:
        """The floors of `program` searched in `space` on `target` (None: no bound); `paths`: the
        value paths of another search of it with this oracle, shared."""
        self.program, self.space, self.oracle, self.config = program, space, oracle, config
        self.target, self.views = target, views
        self.bound_s = float("inf")  # graphs that must take longer are cut
        self.keep = 1  # first kernels kept per computation (`undominated`)
        self.pruned = 0
        self.bounded = 0  # graphs cut by the bound (they might win at another shape)
        self.cuts: Counter[str] = Counter()  # the same, by the floor that cut them (`cut`)
        self.bandwidth = float("inf") if target is None else target.dram_bytes_per_s  # DRAM bytes per second
        self.launch_s = 0.0 if target is None else target.launch_overhead_s
        # kernel and input shapes (`_floor_key`) -> `_floors`
        self._kernel_floors: BoundedDict[bytes, dict[int, float]] = BoundedDict(FLOOR_ENTRIES)
        self._floor_parts: BoundedDict[tuple[bytes, ...], tuple[float, dict[int, float] | None]] = BoundedDict(
            FLOOR_ENTRIES)  # see `_parts`
        self._digests: ObjectCache[Kernel, bytes] = ObjectCache(4096)  # kernel -> `_digest`
        self._whole_floors: dict[tuple[Any, ...], float] = {}  # last kernel's inputs -> `_whole_floor`
        self._middle_owns: dict[tuple[Any, ...], float] = {}  # a middle kernel's inputs -> `middle_own`
        self._grid_floors: BoundedDict[tuple[Any, ...], float] = BoundedDict(FLOOR_ENTRIES)  # see `_grid_floor`
        self._tiled_floors: ObjectCache[BlockState, tuple[float, float] | None] = ObjectCache(FLOOR_ENTRIES)
        # a middle kernel's block space walked whole (its inputs, `kernel._space_key`) -> the least
        # `tiled_floor` of its block graphs, own time and bytes written apart (0 where one has none)
        self.space_floors: BoundedDict[tuple[Any, ...], tuple[float, float]] = BoundedDict(FLOOR_ENTRIES)
        self._body_floors: ObjectCache[BlockState, float] = ObjectCache(FLOOR_ENTRIES)  # see `body_floor`
        # a middle kernel over program inputs only (`middle_key`) -> how often its moves were
        # generated, and once they were twice, the least time of any of them (`least_alone`)
        self.middle_walks: dict[tuple[Any, ...], int] = {}
        self.middle_least: dict[tuple[Any, ...], float] = {}
        self._inputs = random_inputs(self.program)  # small random program inputs for `_fingerprint`
        self.outputs: list[Node] = [self.program.nodes[o] for o in self.program.outputs]
        classes = dim_classes(self.program)
        self._class_sizes = {c: self.program.nodes[n].shape[d] for (n, d), c in classes.items() if c != NO_CLASS}
        # `_after_middle` follows values through the e-graph by their dim classes, which a
        # reshape does not keep.
        self._reach = self.target is not None and all(n.op != Op.RESHAPE for n in self.program.nodes.values())
        self.output_classes = [tuple(classes[(o, d)] for d in range(len(self.program.nodes[o].shape)))
                               for o in self.program.outputs]
        self._free_kernels = self.space.free_kernels != 0  # a kernel to come may be a free view
        # Each grid axis splits a divisor of a program dim: the least latency of a loop iteration.
        self.iteration_s = 0.0 if self.target is None else costmodel.iteration_floor(
            self.target, _block_counts(self.program, self.config.max_grid_axes))
        values = self.values = abstract_program(self.program)  # each program node's abstract value
        self._nbytes = min(get_dtype(n.dtype or "f32").nbytes for n in self.program.inputs)
        self._output_bytes = [self._bytes(KTensor(n.id, n.size_shape, ("c",), ())) for n in self.outputs]
        self._target_leaves = [input_leaves(values[o][0]) for o in self.program.outputs]  # see `inputs_of`
        # What a tensor stored in the program's dtype may hold (None: any value). Where that dtype's
        # range is narrower than f32's (f16's; bf16 has f32's exponent), only the program's own
        # values, which fit wherever the program runs at all (its unfused schedule stores each of
        # them); a value it never holds may not: (X / sum(X)) @ V is about |V|, X @ V about
        # n |V|, past f16's 65,504 for n = 4096 and |V| = 20; so are a weight's row sums and a
        # chunk's partial sums. Sums and products inside a kernel run in f32, where any may.
        narrow = min(get_dtype(n.dtype or "f32").largest for n in self.program.inputs) < get_dtype("f32").largest / 2
        self.stored: frozenset[str | None] | None = frozenset(
            self.oracle.class_of(ae) for n, (ae, _) in values.items()
            if self.program.nodes[n].op != Op.CONST) if narrow else None
        # Where a tensor between kernels holds only those values, the kernels to come are paths over
        # them (`ValuePaths`), given no free view among them and dims that reshapes do not scramble.
        self.paths: ValuePaths | None = None
        if paths is not None:
            self.paths = paths
        elif self._reach and not self._free_kernels and self.target is not None:
            dims = input_classes(self.program)
            start = self._reachable([KTensor(n.id, n.size_shape, values[n.id][0], dims[n.id])
                                     for n in self.program.inputs])  # each value's least dims
            self.paths = ValuePaths.of(
                self.program, self.oracle, values, start, self.stored, self._class_sizes, self._nbytes, self.target,
                self.config.max_block_inputs, max(MAX_OUTPUTS, len(self.program.outputs)),
                self.config.max_grid_axes, self.space.library_ops)

    def cut(self, floor: str) -> None:
        """Count a cut by the bound: which floor made it says where the time of a search goes."""
        self.pruned += 1
        self.bounded += 1
        self.cuts[floor] += 1

    def _bytes(self, t: KTensor) -> float:
        """The fewest bytes tensor `t` can have (a chunked dim counts one chunk)."""
        dims = [d.int_value() if d.is_const() else 1 for d in t.shape]
        if t.chunk is not None:
            dims[t.chunk.dim] = t.chunk.base
        return math.prod(dims) * self._nbytes

    def spent(self, s: KState) -> float:
        """The least time the kernels of `s` take: launches, and reading and writing their tensors;
        once there is a bound, the cost model's estimate of these kernels alone at their best
        sizes (`inf` when no sizes are valid: no graph that contains them can be instantiated)."""
        size = {t.id: self._bytes(t) for t in s.tensors}
        total = sum(self._moving_s(k, size) for k in s.kernels)
        if self.bound_s == float("inf") or self.target is None or not s.kernels:
            return total
        return max(total, self.estimated(s))

    def _moving_s(self, k: Kernel, size: dict[str, float]) -> float:
        """A kernel's launch and the bytes it reads and writes at full bandwidth (0 for a free one:
        a launch argument, a view), below the cost model's estimate of it at any sizes."""
        if isinstance(k, LibraryKernel) and k.op in costmodel.FREE_OPS:
            return 0.0
        moved = sum(size[i] for i in k.tensor_inputs) + sum(size[o] for o in k.outputs)
        return self.launch_s + moved / self.bandwidth

    def known_spent(self, s: KState) -> float:
        """A lower bound of `spent` that analyzes no kernel: each kernel's kept least time
        (`_floors`), or, for one not met before, its launch and bytes (`_moving_s`, below its
        least time). Most middle kernels that the bound cuts are cut by this alone (their output
        must be written and read again), without the costlier analysis of their block graph."""
        size = {t.id: self._bytes(t) for t in s.tensors}
        total = 0.0
        for k in s.kernels:
            if self.target is None:
                total += self._moving_s(k, size)
            elif (floors := self._kernel_floors.get(self._floor_key(s, k))) is None:
                total += max(self._moving_s(k, size), self._grid_floor(s, k))
            else:
                total += min(floors.values(), default=math.inf)
        return total

    def estimated(self, s: KState) -> float:
        """A lower bound of the cost model's time for the kernels of `s` in any graph containing
        them: the sum of each kernel's least estimate over every size its symbols can take there
        (a larger graph adds constraints, never values), or 0 when that is not known. Each
        kernel's is kept: deeper graphs share their first kernels."""
        others, pending = self._parts(s)
        return others + (0.0 if pending is None else min(pending.values(), default=math.inf))

    def _parts(self, s: KState) -> tuple[float, dict[int, float] | None]:
        """The kernels' least times (`_floors`), kept per set of kernels (deeper graphs share
        their first kernels): their sum, except for the one kernel whose per-chunk partials no
        kernel reads yet, if there is exactly one, whose least time per chunk count is returned
        apart (for `merged_later`; None otherwise). (0, None) when the estimates are not known."""
        assert self.target is not None
        whole = tuple(self._digest(k) for k in s.kernels)
        hit = self._floor_parts.get(whole)
        if hit is None:
            hit = self._floor_parts[whole] = self._split_floors(s)
        return hit

    def _split_floors(self, s: KState) -> tuple[float, dict[int, float] | None]:
        # Each kernel's floors, kept: the prefix sGraph is analyzed only for kernels not met
        # before (a middle kernel recurs after every first kernel computing the same tensors).
        floors: dict[str, dict[int, float]] = {}
        prefix: tuple[SGraph, dict[str, list[int]]] | None = None
        for k in s.kernels:
            hit = self._kernel_floors.get(self._floor_key(s, k))
            if hit is None:
                if prefix is None and (prefix := self._prefix(s)) is None:
                    return 0.0, None
                hit = self._floors(s, *prefix, k)
            floors[k.id] = hit
        read = {t for k in s.kernels for t in k.tensor_inputs}
        unmerged = {t.id for t in s.tensors if t.chunk is not None and t.id not in read}
        pending = [k.id for k in s.kernels if unmerged & set(k.outputs)]
        lone = pending[0] if len(pending) == 1 else None
        others = sum(min(f.values(), default=math.inf) for kid, f in floors.items() if kid != lone)
        return others, None if lone is None else floors[lone]

    def _prefix(self, s: KState) -> tuple[SGraph, dict[str, list[int]]] | None:
        """The kernels of `s` as an sGraph (what they compute and nothing reads, its outputs), and
        every value each of its symbols can take in any graph containing them; None when either
        is not known."""
        read = set().union(*(k.tensor_inputs for k in s.kernels))
        produced = [o for k in s.kernels for o in k.outputs]
        stored, views = self.views.input_kernels(read) if self.views is not None else ([], [])
        decls = {d.id: d for d in stored}  # a view of an input is read in the input's layout
        viewed = {v.output for v in views}
        decls.update((d.id, d) for d in input_decls(self.program) if d.id in read and d.id not in viewed)
        try:
            sg = SGraph(tuple(decls.values()), (*views, *s.kernels), tuple(o for o in produced if o not in read),
                        "prefix")
            values = bounded_candidates(sg)
        except SGraphError:
            return None
        return None if values is None else (sg, values)

    def _floors(self, s: KState, sg: SGraph, values: dict[str, list[int]], k: Kernel) -> dict[int, float]:
        """Kernel k's least estimated time, per chunk count when its outputs are per-chunk partials
        (`costmodel.kernel_floors`); kept per kernel and input shapes (deeper graphs share kernels)."""
        assert self.target is not None
        key = self._floor_key(s, k)
        hit = self._kernel_floors.get(key)
        if hit is None:
            chunks = next((t.chunk.axis for t in s.tensors  # a symbol unless the search is concrete
                           if t.id in k.outputs and t.chunk is not None and not t.chunk.size.is_const()), None)
            hit = self._kernel_floors[key] = costmodel.kernel_floors(sg, self.target, k, values, by=chunks)
        return hit

    def _floor_key(self, s: KState, k: Kernel) -> bytes:
        """What a kernel's floors depend on: the kernel and the shapes of its inputs (and, for a
        reshape, whether a library kernel reads it: of a view, it then copies)."""
        copied = isinstance(k, LibraryKernel) and k.op == Op.RESHAPE and read_by_library(s.kernels, k.output)
        return self._digest(k) + repr([t.shape for t in s.tensors if t.id in k.tensor_inputs]).encode() \
            + b"copied" * copied

    def _digest(self, k: Kernel) -> bytes:
        """A 128-bit digest of repr(k), the key of a kernel's floors: kept per kernel object
        (states grown from one kernel share the object; a block graph's repr is slow). A digest,
        not the text: the floors of a long search are kept for some 100,000 kernels, whose
        texts take a kilobyte or more each."""
        return self._digests.get(k, None, lambda: hashlib.blake2b(repr(k).encode(), digest_size=16).digest())

    def ranked_first(self, st: KState) -> FirstKernel | None:
        """`st` with what ranks it among the first kernels computing the same values; None when
        no graph it starts can beat the bound (its least time, a launch after it and what the
        later kernels must move: what `_at_depth` asks of it at any depth, the bound only
        tightening), before its text is written: a gated MLP's first kernels over X and both
        weights all are."""
        after = self.space.launches(1) * self.launch_s + self.owed(st)(()) / self.bandwidth
        if self.target is not None and self.bound_s < math.inf and \
                self._grid_floor(st, st.kernels[0]) + after > self.bound_s:
            self.cut("first kernel")
            return None
        prefix = self._prefix(st) if self.target is not None else None
        if prefix is None:
            return FirstKernel(st, None, "")
        floors = self._floors(st, *prefix, st.kernels[0])
        if min(floors.values(), default=math.inf) + after > self.bound_s:
            self.cut("first kernel")
            return None
        return FirstKernel(st, floors, prefix[0].dumps())

    def _grid_floor(self, s: KState, k: Kernel) -> float:
        """A floor of the estimate of kernel k of `s`, a graph kernel, from its own grid alone,
        known before the prefix sGraph is built and its sizes bounded (`_floors`, far costlier):
        `costmodel.whole_reduction_floor` over its axes, each over the program dim classes of the
        input dims it splits (a size dividing theirs), of what its inputs hold (an input is read
        again by every block along an axis that splits none of its classes) and what it writes
        (one chunk of partials). 0 for a library kernel, or when it reads partials (a merge's loop
        walks them) or an axis splits a dim of no class. Nearly all the first kernels of a gated
        MLP that the bound cuts are cut by this alone."""
        assert self.target is not None
        if not isinstance(k, GraphKernel):
            return 0.0
        held = {t.id: t for t in s.tensors}
        ins = [held[i.tensor] for i in k.block.inputs]
        if any(t.chunk is not None for t in ins):
            return 0.0
        axes = []
        for a in range(len(k.block.grid)):
            split = {t.classes[i.imap[a]] for i, t in zip(k.block.inputs, ins, strict=True) if i.imap[a] is not None}
            if NO_CLASS in split:
                return 0.0
            axes.append((frozenset(split), self._axis_extent(split)))
        reads = tuple(sorted(map(self._read, ins)))
        written = sum(self._bytes(t) for t in s.tensors if t.id in k.outputs)
        key = (reads, written, tuple(axes))
        hit = self._grid_floors.get(key)
        if hit is None:
            hit = self._grid_floors[key] = costmodel.whole_reduction_floor(
                self.target, reads, written, axes, len(axes))
        return hit

    def undominated(self, firsts: list[FirstKernel]) -> list[FirstKernel]:
        """The first kernels that fewer than `keep` others beat (`_beats`) among those computing
        the same values into tensors of the same shapes and chunks: tiled differently, or the
        same function by other ops (a scale applied to Q, to K or to Q K). Same values: each
        output's abstract expression in one e-class of the target's e-graph (so the oracle admits
        the same kernels after them) and equal numeric fingerprints (`search.fingerprint`: the
        expressions drop some constants). What can follow a first kernel depends only on
        the tensors it computes, and a graph's estimate is its first kernel's own plus the
        rest's (they share no symbol but a chunk count, compared per count), so a beaten first
        kernel leads only to graphs that rank behind `keep` others. One with no valid sizes
        leads to no graph that can be instantiated. A first kernel met twice with a known
        estimate (a part of a concrete search repeats the others) is kept once."""
        if self.target is None or len(firsts) <= self.keep:
            return firsts
        start = len(self.program.inputs)
        groups: dict[tuple[Any, ...], list[FirstKernel]] = {}
        for f in firsts:
            if f.floors is None:
                continue  # its estimate is not known: never cut
            values = tuple((self.oracle.class_of(t.ae), t.shape, t.chunk) for t in f.state.tensors[start:])
            members = groups.setdefault((values, self._fingerprint(f.state.kernels[0])), [])
            if all(m.text != f.text for m in members):
                members.append(f)
        kept = {id(f) for f in firsts if f.floors is None}
        kept |= {id(b) for members in groups.values() for b in members
                 if b.floors and sum(_beats(a, b) for a in members if a is not b) < self.keep}
        self.pruned += len(firsts) - len(kept)
        return [f for f in firsts if id(f) in kept]

    def _fingerprint(self, k: Kernel) -> tuple[bytes, ...]:
        assert isinstance(k, GraphKernel)
        return fingerprint(k, self._inputs)

    def _unwritten(self, s: KState) -> float:
        return sum(self._output_bytes[i] for i in self.missing(s))

    def last_kernel_floor(self, s: KState) -> float:
        """The least time of `s` plus a last kernel that writes the missing outputs (before the
        bytes that last kernel reads); 0 when there is no bound, so nothing is cut."""
        if self.bound_s == float("inf"):
            return 0.0
        return self.spent(s) + self.launch_s + self._unwritten(s) / self.bandwidth

    def too_slow(self, s: KState, floor_s: float, inputs: Sequence[int]) -> bool:
        """Would any last library kernel reading these tensors exceed the bound?"""
        too_slow = floor_s + sum(self._bytes(s.tensors[i]) for i in set(inputs)) / self.bandwidth > self.bound_s
        if too_slow:
            self.cut("last library kernel")
        return too_slow

    def _whole_floor(
        self, s: KState, inputs: tuple[int, ...], missing: list[int], loop: int = 1, more_inputs: bool = False,
    ) -> float:
        """The least time of a last graph kernel reading these tensors (`costmodel.whole_reduction_floor`:
        a last kernel writes no partial results, so its grid splits only classes of the outputs
        it writes, the missing ones, whose dims carry the program outputs' classes by
        `_completes_exactly`), known before its block graphs are generated; 0 without a bound
        (or with no output missing, which no last kernel completes exactly). `more_inputs`: the
        kernel may read other tensors too (its grid may then split any class of the outputs:
        more ways to cut the same reads, a lower floor)."""
        if self.bound_s == float("inf") or self.target is None or not missing:
            return 0.0
        return self._read_floor([self._read(s.tensors[i]) for i in inputs], missing, loop, more_inputs)

    def _axis_extent(self, split: Collection[int]) -> int:
        """What a grid axis splitting these classes divides: their sizes' lcm (any class's for an
        axis that splits no input)."""
        return math.lcm(*(self._class_sizes[c] for c in (split or self._class_sizes)))

    def _read(self, t: KTensor) -> tuple[float, frozenset[int]]:
        """What a kernel reading `t` reads: its fewest bytes and the program dim classes it spans."""
        return self._bytes(t), frozenset(t.classes) - {NO_CLASS}

    def _read_floor(
        self, reads: Sequence[tuple[float, frozenset[int]]], missing: list[int], loop: int = 1,
        more_inputs: bool = False,
    ) -> float:
        """`_whole_floor` of a last kernel reading tensors of these bytes and dim classes."""
        assert self.target is not None
        read = tuple(sorted(reads))
        key = (read, tuple(missing), loop, more_inputs)
        hit = self._whole_floors.get(key)
        if hit is None:
            axes = self._output_axes(tuple(missing))
            if not more_inputs:
                classes = frozenset().union(*(c for _, c in read))
                axes = [a for a in axes if a[0] & classes]
            hit = self._whole_floors[key] = costmodel.whole_reduction_floor(
                self.target, read, sum(self._output_bytes[i] for i in missing), axes, self.config.max_grid_axes, loop)
        return hit

    def _output_axes(self, missing: tuple[int, ...]) -> list[tuple[frozenset[int], int]]:
        """The grid axes a kernel writing exactly these program outputs may have: (program dim
        classes it splits, a size the axis size divides). One class of each output: one they all
        have, or classes side by side (`tiling._side_by_side`), whose sizes' gcd the axis divides."""
        choices = [[(c, d.int_value()) for c, d in zip(self.output_classes[i], self.outputs[i].size_shape,
                                                       strict=True) if c != NO_CLASS] for i in missing]
        axes = {(frozenset(c for c, _ in pick), math.gcd(*(size for _, size in pick))) for pick in product(*choices)}
        return sorted(axes, key=lambda a: (sorted(a[0]), a[1]))

    def missing(self, s: KState) -> list[int]:
        """Program outputs no tensor of `s` matches yet."""
        return [
            i for i, node in enumerate(self.outputs)
            if not any(t.chunk is None and self.is_output(t.ae, t.shape, t.classes, i) for t in s.tensors)
        ]

    def unused(self, s: KState) -> list[int]:
        """The kernel outputs that no kernel reads and no program output can be: a later kernel
        must read each, as a candidate reads or returns every tensor (`_candidate`; checked
        early, it saves whole searches of the last kernel over the program's raw inputs)."""
        read = {i for k in s.kernels for i in k.tensor_inputs}
        return [n for n, t in enumerate(s.tensors) if n >= len(self.program.inputs) and t.id not in read and not any(
            t.chunk is None and self.is_output(t.ae, t.shape, t.classes, i) for i in range(len(self.outputs)))]

    def inputs_of(self, outputs: list[int]) -> set[str]:
        return set().union(*(self._target_leaves[i] for i in outputs))

    def classes_of(self, outputs: list[int]) -> set[int]:
        """The program dim classes of these outputs' dims. A block graph's tiles take their dims'
        classes from its inputs' (no block op makes a dim: reshapes and transposes are library
        kernels), and a last kernel writes dims of the outputs' classes (`_completes_exactly`), so
        it must read a tensor with a dim of each (a head dim a reshape made, say)."""
        return {c for i in outputs for c in self.output_classes[i] if c >= 0}

    def lacks_classes(self, s: KState) -> bool:
        """Does a missing output that is no reshape have a dim class no tensor of `s` has? Only a
        library reshape makes one, so two kernels more at least must follow: that reshape, and
        one computing the output from what it makes. (An output that is itself a reshape may be
        made by the reshape as the last kernel.)"""
        missing = [i for i in self.missing(s) if self.outputs[i].op != Op.RESHAPE]
        return not self.classes_of(missing) <= set().union(*(t.classes for t in s.tensors))

    def last_graph_floor(self, s: KState, spent: float, subset: tuple[int, ...], missing: list[int]) -> float:
        """The least time of `s` plus a last graph kernel over these tensors: `spent` plus
        `_whole_floor`, or when that kernel merges the chunks of a kernel of `s`, the two
        kernels' floors at the same chunk count (the merge's loop walks the chunks)."""
        floor = spent + self._whole_floor(s, subset, missing)
        if any(s.tensors[i].chunk is not None for i in subset):
            floor = max(floor, self.merged_later(s, lambda chunks: self._whole_floor(s, subset, missing, chunks)))
        return floor

    def middle_floor(
        self, s: KState, later: int, part: tuple[int, int] = (1, 0), then_last: bool = True,
    ) -> Callable[..., float]:
        """The least time of `s` plus a graph kernel over a subset of its tensors and `later`
        kernels after it, known before that kernel's block graphs are: `s`'s kernels, this
        kernel's least time (`middle_own`, or over program inputs only, once known, the least
        time of the kernels they make: `middle_least`), then each later one's launch and what
        they must move (`owed`), or when one kernel follows and `then_last` says it is the
        last (not so for a first kernel kept for deeper graphs), its least time (`_last_after`);
        or, where larger, this kernel and the later ones as paths over program values
        (`paths_after`). Once a block graph of that kernel is known, `own` and `unread`
        (`tiled_floor`) raise its least time and what the later kernels must read."""
        spent = self.spent(s)
        rest = self.space.launches(later) * self.launch_s
        owed = self.owed(s)
        last = self._last_after(s) if later == 1 and then_last else None
        paths = self.paths_after(s, self._after(s, later, then_last), self.bound_s - spent)
        known: dict[tuple[int, ...], tuple[float, float, float, float]] = {}  # per subset: (own, owed, last, paths)

        def floor(subset: tuple[int, ...], own: float = 0.0, unread: float = 0.0) -> float:
            if (parts := known.get(subset)) is None:
                least = self.middle_own(s, subset)
                if (walked := self.middle_key(s, subset, part)) is not None:
                    least = max(least, self.middle_least.get(walked, 0.0))
                parts = known[subset] = (least, owed(subset), 0.0 if last is None else last(subset),
                                         0.0 if paths is None else paths(subset))
            least, owes, last_s, path_s = parts
            return spent + max(max(least, own) + max(rest + (owes + unread) / self.bandwidth, last_s), path_s)

        return floor

    def paths_after(
        self, s: KState, kernels: Sequence[int], budget: float,
    ) -> Callable[[tuple[int, ...]], float] | None:
        """The least time of a kernel over a subset of the tensors of `s` and then one of these
        numbers of kernels (`ValuePaths.after`: what it can write decides what the later ones
        must do), where within `budget`, else a lower bound over it; None where the paths bound
        nothing (`paths` None, or a tensor of `s` holds no program value: partials)."""
        known = self._reads_of(s)
        if known is None or not kernels:
            return None
        held, reads_of = known
        paths = self.paths
        assert paths is not None

        def floor(subset: tuple[int, ...]) -> float:
            return paths.after(held, reads_of(subset), kernels, budget)

        return floor

    def _after(self, s: KState, later: int, then_last: bool) -> list[int]:
        """The numbers of kernels that may follow one more kernel of `s`: exactly `later`, or for a
        first kernel kept for every depth (not `then_last`), any number."""
        return [later] if then_last else list(range(1, self.config.max_kernel_ops - len(s.kernels)))

    def writable(
        self, s: KState, later: int, then_last: bool = True,
    ) -> Callable[[tuple[int, ...]], tuple[int, ...]] | None:
        """For a graph kernel over a subset of the tensors of `s` and `later` kernels after it (as
        `middle_floor`): the sets of program values it may write (`ValuePaths` masks) that leave
        a path within the bound (`ValuePaths.writable`); None where the paths bound nothing."""
        known = self._reads_of(s)
        if known is None or self.bound_s == math.inf:
            return None
        held, reads_of = known
        paths = self.paths
        assert paths is not None
        after, budget = self._after(s, later, then_last), self.bound_s - self.spent(s)

        def writable(subset: tuple[int, ...]) -> tuple[int, ...]:
            return paths.writable(held, reads_of(subset), after, budget)

        return writable

    def _reads_of(self, s: KState) -> tuple[int, Callable[[tuple[int, ...]], int]] | None:
        """What the tensors of `s` hold (a `ValuePaths` mask), and what a kernel over a subset of
        them reads; None where the paths bound nothing (`_held`)."""
        classes = [self.oracle.class_of(t.ae) for t in s.tensors]
        held = self._held(s, classes)
        if held is None:
            return None
        paths = self.paths
        assert paths is not None

        def reads_of(subset: tuple[int, ...]) -> int:
            reads = paths.held([classes[i] for i in subset])
            assert reads is not None  # (each tensor holds a program value: `_held`)
            return reads

        return held, reads_of

    def writes_none_of(self, block: BlockState, writable: tuple[int, ...]) -> bool:
        """Does a complete block graph write none of these sets of program values (masks)?"""
        assert self.paths is not None
        return self.paths.held([self.oracle.class_of(ae) for ae, _, _ in sinks(block)]) not in writable

    def writes_none_from(self, body: BlockState, writable: tuple[int, ...]) -> bool:
        """Can no post-loop graph over a loop body's accumulators write one of these sets of
        program values (masks), reading each accumulator (`ValuePaths.may_write`)?"""
        assert self.paths is not None
        accs = [t for t in body.tiles if t.op == "acc"]
        return not self.paths.may_write([self.oracle.class_of(t.ae) for t in accs if not t.gathers],
                                        [self.oracle.class_of(t.ae) for t in accs if t.gathers], writable)

    def paths_floor(self, s: KState, kernels: int) -> float:
        """The least time of `s` and `kernels` more kernels, as paths over the program values they
        may store (`ValuePaths.least`, asked only as far as the bound: a lower bound above it);
        0 where those bound nothing."""
        held = self._held(s, [self.oracle.class_of(t.ae) for t in s.tensors])
        if held is None:
            return 0.0
        assert self.paths is not None
        spent = self.spent(s)
        return spent + self.paths.least(held, kernels, self.bound_s - spent)

    def _held(self, s: KState, classes: Sequence[str | None]) -> int | None:
        """The program values the tensors of `s` hold (these e-classes), as a `ValuePaths` mask;
        None where the paths bound nothing (`paths` None, or a tensor holds partials or no
        program value)."""
        if self.paths is None or any(t.chunk is not None for t in s.tensors):
            return None
        return self.paths.held(classes)

    def tiled_floor(self, s: KState, subset: tuple[int, ...], block: BlockState) -> tuple[float, float] | None:
        """A floor of every graph kernel that block graph `block` over these tensors of `s` tiles
        into (`tiling.resolve`), known before its tilings are searched (most of a middle kernel's
        search after the block graphs themselves): the least
        `_grid_floor` over every axis they may take (`tiling.axis_options`: a class of each
        output, or a reduced one only where its partials can be summed), with the bytes of its
        outputs, which a later kernel must then read (the second value). None when unknown: it
        reads partials, an axis would split a dim of no class, or it writes a program output
        (written once, not read again: `owed` counts it already). Inf when it writes a value that
        no tensor between kernels may hold (`stored`): it may only be a last kernel. Kept per
        block graph (a block space is replayed after every earlier kernel computing the same
        tensors)."""
        assert self.target is not None
        if any(s.tensors[i].chunk is not None for i in subset):
            return None
        return self._tiled_floors.get(block, None, lambda: self._block_floor(s, subset, block))

    def body_floor(self, s: KState, subset: tuple[int, ...], body: BlockState) -> float:
        """A floor of every graph kernel over these tensors of `s` whose block graph completes loop
        body `body` (with its accumulators), known before its post-loop graphs are generated (most
        of a block space's states): `middle_own` with single grid axes over the classes the body
        leaves splittable (`tiling.splittable_classes`). Kept per body, as `tiled_floor`."""
        return self._body_floors.get(body, None, lambda: self.middle_own(s, subset, splittable_classes(body)))

    def _block_floor(self, s: KState, subset: tuple[int, ...], block: BlockState) -> tuple[float, float] | None:
        assert self.target is not None
        outputs = sinks(block)
        if self.stored is not None and any(self.oracle.class_of(ae) not in self.stored for ae, _, _ in outputs):
            return math.inf, math.inf  # stored for a later kernel, a value the program never holds may overflow
        if any(self.is_output(ae, shape, pdims, i) for ae, shape, pdims in outputs for i in range(len(self.outputs))):
            return None
        axes = []
        for classes in axis_options(block):
            split = frozenset(block.classes.program[c] for c in classes)
            if NO_CLASS in split:
                return None
            axes.append((split, self._axis_extent(split)))
        reads = tuple(sorted(self._read(s.tensors[i]) for i in subset))
        written = sum(math.prod(d.int_value() for d in shape) for _, shape, _ in outputs) * self._nbytes
        options = tuple(sorted(set(axes), key=lambda a: (sorted(a[0]), a[1])))
        key = ("tiled", reads, written, options)  # kept with the grid floors (theirs have no tag)
        if (floor := self._grid_floors.get(key)) is None:
            floor = self._grid_floors[key] = costmodel.whole_reduction_floor(
                self.target, reads, written, options, self.config.max_grid_axes)
        return floor, written

    def middle_key(self, s: KState, subset: tuple[int, ...], part: tuple[int, int]) -> tuple[Any, ...] | None:
        """What the middle kernels over these tensors of `s` depend on, when they read program
        inputs only: the inputs, the kernel's place (its id and symbols' names) and the part of
        its block graphs; None otherwise (they read what earlier kernels computed)."""
        if max(subset) >= len(self.program.inputs):
            return None
        return subset, len(s.kernels), s.graph_kernels, part

    def least_alone(self, s: KState, k: Kernel, outputs: Sequence[KTensor]) -> float:
        """The least estimated time of kernel k, which reads program inputs only and writes
        `outputs`, in any graph (`_floors` of k alone: a graph adds constraints on its sizes,
        never values); 0 when not known. Kept with the other kernels' floors, so that states
        holding k are cut by `known_spent` without analyzing it again."""
        alone = KState((*s.tensors[:len(self.program.inputs)], *outputs), (k,), ())
        floors = self._kernel_floors.get(self._floor_key(alone, k))
        if floors is None:
            prefix = self._prefix(alone)
            if prefix is None:
                return 0.0
            floors = self._floors(alone, *prefix, k)
        return min(floors.values(), default=math.inf)

    def _last_after(self, s: KState) -> Callable[[tuple[int, ...]], float] | None:
        """The least time of the last kernel after `s` and a middle kernel over a subset of its
        tensors: it reads what that subset leaves unread (the program inputs the missing outputs
        need, the kernel outputs nothing reads: `owed`) and, when one output is missing, an
        output of the middle kernel (which would otherwise not contribute: writing the output
        itself leaves the last kernel nothing to do). Then its inputs must let it compute that
        output (`_after_middle`); else, with more tensors to read than any library op takes, its
        floor is `_whole_floor` over them, and 0 when a library kernel may be last. None when any
        kernel may be a free view."""
        missing = self.missing(s)
        if self._free_kernels or not missing:
            return None
        arity = max((ops.OPS[op].arity for op in self.space.library_ops), default=0)
        unread, unused = self._left_to_read(s)
        middle_output = len(missing) == 1

        def floor(subset: tuple[int, ...]) -> float:
            must = tuple(sorted({i for i in (*unread, *unused) if i not in subset}))
            if middle_output and self._reach:
                reach = self._reachable([s.tensors[i] for i in subset])
                if self.stored is not None:  # what the middle kernel may store for the last (`stored`)
                    reach = {c: dims for c, dims in reach.items() if c in self.stored}
                return self._after_middle(s, must, reach, missing[0], arity)
            if len(must) + middle_output <= arity:
                return 0.0
            return self._whole_floor(s, must, missing, more_inputs=True)

        return floor

    def _reachable(self, tensors: Sequence[KTensor]) -> Mapping[str, frozenset[int]]:
        """The values a kernel reading these tensors can compute, with the dim classes each spans
        at least (`Reach.of`; per-chunk partials span their dims once merged: the chunks stack
        along a dim of the merged value's class)."""
        start: dict[str, frozenset[int]] = {}
        for t in tensors:
            cls = self.oracle.class_of(t.ae)
            if cls is not None:
                spans = self._read(t)[1]
                start[cls] = start[cls] & spans if cls in start else spans
        return self.oracle.reach.of(start)

    def _after_middle(
        self, s: KState, base: tuple[int, ...], middle: Mapping[str, frozenset[int]], output: int, arity: int,
    ) -> float:
        """The least time of a last kernel that computes program output `output` reading the
        tensors `base` of `s`, at least one output of a middle kernel (a value of `middle`, the
        values that kernel can compute: `_reachable`) and any other tensors of `s`: inf when none
        can. Its inputs must let it compute the output (`Reach.of`). A graph kernel takes at least
        `_read_floor` of `base` and each other input, so at least the least threshold whose inputs
        under it let it compute the output, one of them the middle's; a library kernel reads
        `base` and at most `arity` tensors in all. A middle output of value X spans X's dims
        (`Reach`): as few bytes as their sizes, read again no more often than a tensor spanning
        more dims would be (each extra dim splits at most as many ways as it multiplies bytes)."""
        target = self.oracle.output_class(output)
        if target is None:
            return 0.0
        reach = self.oracle.reach
        reads = [self._read(s.tensors[i]) for i in base]
        have = {c for i in base if (c := self.oracle.class_of(s.tensors[i].ae)) is not None}
        others: list[tuple[str, tuple[float, frozenset[int]], bool]] = [
            (c, self._read(t), False) for i, t in enumerate(s.tensors)
            if i not in base and (c := self.oracle.class_of(t.ae)) is not None]
        others += [(c, (self._nbytes * math.prod(self._class_sizes[d] for d in dims), dims), True)
                   for c, dims in middle.items()]
        if self.oracle.class_of(C) is None:  # a middle output may be a constant outside the e-graph
            others.append(("", (self._nbytes, frozenset()), True))

        def computes(extra: Sequence[str]) -> bool:
            return target in reach.of(dict.fromkeys((*have, *extra), frozenset()))

        # A graph kernel: the least threshold on the inputs' own floors that lets it compute.
        ranked = sorted((self._read_floor([*reads, read], [output], more_inputs=True), c, mid)
                        for c, read, mid in others)
        graph = math.inf
        first_mid = next((k for k, (_, _, mid) in enumerate(ranked) if mid), None)
        if first_mid is not None:
            lo, hi = first_mid, len(ranked)  # the answer is in [lo, hi) (hi: none computes)
            while lo < hi:
                mid_k = (lo + hi) // 2
                if computes([c for _, c, _ in ranked[:mid_k + 1]]):
                    hi = mid_k
                else:
                    lo = mid_k + 1
            if lo < len(ranked):
                graph = ranked[lo][0]
        # A library kernel: `base` and one to `arity - len(base)` more inputs, one of the middle's.
        moved = sum(b for b, _ in reads) + self._output_bytes[output]
        library = sorted((self.launch_s + (moved + sum(read[0] for _, read, _ in extra)) / self.bandwidth,
                          tuple(c for c, _, _ in extra))
                         for n in range(1, arity - len(base) + 1) for extra in combinations(others, n)
                         if any(mid for _, _, mid in extra))
        return min(graph, next((cost for cost, extra in library if cost < graph and computes(extra)), math.inf))

    def middle_own(self, s: KState, subset: tuple[int, ...], splittable: frozenset[int] | None = None) -> float:
        """The least time of a graph kernel that reads these tensors of `s` and is not the last:
        its launch plus the larger of their bytes at full bandwidth and one loop iteration; when
        none is per-chunk partials, `costmodel.whole_reduction_floor` with its grid free to split
        any class of what it reads (it may write partial results), or, with `splittable`, one of
        those alone (side by side, any) and nothing written: splitting a class re-reads every
        input without it, so a grid large enough to fill the DRAM pipe re-reads some input
        (attention's Q, K and Q K cost more than their bytes)."""
        tensors = [s.tensors[i] for i in subset]
        own = self.launch_s + max(sum(map(self._bytes, tensors)) / self.bandwidth, self.iteration_s)
        if self.target is None or any(t.chunk is not None for t in tensors):
            return own  # a merge's loop walks the chunks: its reads are not one tile per block
        sizes: dict[int, int] = {}
        owners: dict[int, int] = {}  # class -> how many of the tensors have it (at a size over 1)
        for t in tensors:
            had: set[int] = set()
            for c, d in zip(t.classes, t.shape, strict=True):
                size = d.int_value() if d.is_const() else 1
                if c == NO_CLASS or size == 1:
                    continue  # a unit dim: nothing to split
                if sizes.setdefault(c, size) != size:
                    return own  # a class split at two sizes: no axis divides both
                had.add(c)
            for c in had:
                owners[c] = owners.get(c, 0) + 1
        read = tuple(sorted(self._read(t) for t in tensors))
        key = (read, tuple(sorted(sizes.items())), tuple(sorted(owners.items())), splittable)
        hit = self._middle_owns.get(key)
        if hit is None:
            # Each class alone, and the classes that one tensor each has together (its outputs,
            # not known yet, may take them side by side: `tiling._side_by_side`; an axis over
            # some of them divides each one's size, so it divides their lcm), as often as
            # disjoint pairs of them can be axes.
            axes = [(frozenset({c}), size) for c, size in sizes.items() if splittable is None or c in splittable]
            group = frozenset(c for c in sizes if owners[c] == 1)
            axes += [(group, math.lcm(*(sizes[c] for c in group)))] * min(len(group) // 2, self.config.max_grid_axes)
            hit = self._middle_owns[key] = costmodel.whole_reduction_floor(
                self.target, read, 0.0, axes, self.config.max_grid_axes)
        return max(own, hit)

    def owed(self, s: KState) -> Callable[[tuple[int, ...]], float]:
        """The fewest bytes the kernels after `s` must move, but for one reading a subset of its
        tensors: the missing outputs, the program inputs they read that no kernel reads yet, and
        the kernel outputs nothing reads yet; nothing when a later kernel may be free (a
        view of a computed tensor can be an output, or what an input or a kernel's output feeds)."""
        if self._free_kernels:
            return lambda subset: 0.0
        unread, unused = self._left_to_read(s)
        written = sum(self._output_bytes[i] for i in self.missing(s))

        def owed(subset: tuple[int, ...]) -> float:
            return written + sum(self._bytes(s.tensors[i]) for i in (*unread, *unused) if i not in subset)

        return owed

    def _left_to_read(self, s: KState) -> tuple[list[int], list[int]]:
        """What the kernels after `s` must read: the program inputs the missing outputs need that
        no kernel reads yet, and the kernel outputs nothing reads yet (`unused`)."""
        read = {i for k in s.kernels for i in k.tensor_inputs}
        needed = self.inputs_of(self.missing(s))
        unread = [n for n, t in enumerate(s.tensors[:len(self.program.inputs)]) if t.id in needed and t.id not in read]
        return unread, self.unused(s)

    def merged_later(self, s: KState, merge_s: Callable[[int], float]) -> float:
        """When one kernel of `s` writes per-chunk partials that no kernel reads yet, some later
        kernel merges them, its loop walking the chunks: the least time of the kernels of `s` with
        that merge's least time beyond its launch at each chunk count (`merge_s(chunks)`),
        minimized over the chunk count they share; without such a kernel, `estimated`; 0 without
        a bound."""
        if self.bound_s == float("inf") or self.target is None:
            return 0.0
        others, pending = self._parts(s)
        if pending is None:
            return others
        return others + min((f + merge_s(c) for c, f in pending.items()), default=math.inf)

    def is_output(self, ae: AE, shape: tuple[Size, ...], classes: tuple[int, ...], i: int) -> bool:
        """Does a tensor hold program output i: its expression, shape and dim classes? (A transpose
        keeps the expression, and a square one the shape; a reshape's dims have no class to compare.)"""
        wanted = self.output_classes[i]
        return shape == self.outputs[i].size_shape and all(
            RESHAPED in (p, c) or same_classes((p,), (c,)) for p, c in zip(classes, wanted, strict=True)
        ) and self.oracle.equivalent(ae, i)


def _beats(a: FirstKernel, b: FirstKernel) -> bool:
    """Does a first kernel lead to a better graph than another computing the same tensors,
    whatever follows? At no chunk count is it slower, and it wins the ties: by its text (graphs
    that tie in time are ordered by their text, which differs first in the first kernel) or by
    being faster at every count (by more than float rounding of the sums)."""
    fa, fb = a.floors or {}, b.floors or {}
    if any(c not in fa or fa[c] > fb[c] for c in fb):
        return False
    return a.text < b.text or all(fa[c] * (1 + TIE) < fb[c] for c in fb)

def _block_counts(program: Program, max_grid: int) -> list[int]:
    """Every block count a graph kernel can have: products of at most `max_grid` grid axis sizes,
    each a divisor of a program dim (a split class; chunk dims are walked, never split)."""
    sizes = sorted({d for n in program.nodes.values() for size in n.shape for d in divisors(size)})
    counts = {1}
    for _ in range(max_grid):
        counts |= {c * d for c in counts for d in sizes}
    return sorted(counts)

def same_classes(pdims: tuple[int, ...], classes: tuple[int, ...]) -> bool:
    """Do a tile's dims carry these program dim classes (size-1 dims have none to compare)?"""
    return all(c == NO_CLASS or p == c for p, c in zip(pdims, classes, strict=True))
