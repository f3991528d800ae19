"""The least time of the kernels still to come, as paths over the program values they may store.

In a dtype narrower than f32 every tensor between kernels holds one of the program's values
(`Floors.stored`), and no kernel writes per-chunk partials (they are no program value). So the
kernels after a state are a path over sets of program values (their e-classes): each reads some
values held by then (`reads`) and writes some it can compute from them (`writes`: `Reach`, at
most a block graph's outputs), and takes at least `_kernel_floor(reads, writes)`; the last one
writes the outputs still missing. `ValuePaths.least(held, kernels)` is the cheapest path of that
many kernels from the values `held`: a floor of every graph the search can still grow from a state
holding them, known before any of those kernels' block graphs are (a whole depth of a search is
cut at its root when its floor exceeds the best proved time).

What makes the floor of one kernel strong is what it writes. Its grid splits only classes of its
outputs (a class they all have, or classes side by side, each of one input only: as
`tiling.axis_options` offers them, without partial results), and an input is split along such a
class only where no reduction over that class needs the whole of what the input feeds: a
softmax's probabilities read from Q and K re-read K along every block of their columns, since
the row sums need every column of exp(Q K) (`_splits`). Over many reads the floor is not
monotone (reading a row sum as well frees the columns of Q K), so every set of reads is tried.

What a kernel may write and still leave a path within the bound (`writable`) bounds its block
graphs before they are complete: a loop body whose accumulators cannot be read, every one, on
the way to one of those sets of values (`may_write`) has no post-loop graph worth generating.

Bytes and dim classes of a value are the least every tensor holding it spans (`Reach`): a tensor
spanning more dims moves more bytes than it saves re-reads. The classes its tensor may be split
along are those of the program's nodes of that value (a stored tensor holds one up to a
transpose: `StoredValues`) and those `Reach` finds.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations, product
from typing import Any

from superopt import costmodel, ops
from superopt.dimclasses import NO_CLASS, dim_classes
from superopt.program import Program
from superopt.targets import Target
from superopt.verifier.oracle import AE, Oracle
from superopt.verifier.reach import Reach

MAX_VALUES = 12  # program values (e-classes) above which no paths are searched: 2^n sets of them
Dims = frozenset[int]


def _depth(e: Any) -> int:
    """The height of an abstract expression (leaves 0)."""
    kids = [k for k in e[1:] if isinstance(k, tuple)] if isinstance(e, tuple) else []
    return 1 + max(map(_depth, kids)) if kids else 0


def _bits(indices: Iterable[int]) -> int:
    """A set of indices as a bit mask."""
    mask = 0
    for i in indices:
        mask |= 1 << i
    return mask


class ValuePaths:
    """Floors of the kernels to come over sets of program values, each a bit mask of `classes`.
    Built by `Floors` for a narrow-dtype program without views or reshapes (`of`)."""

    def __init__(self, program: Program, oracle: Oracle, values: Mapping[str, tuple[AE, Any]],
                 start: Mapping[str, Dims], stored: frozenset[str | None], class_sizes: Mapping[int, int],
                 nbytes: int, target: Target, max_inputs: int, max_outputs: int, max_grid: int,
                 library_ops: Sequence[str]) -> None:
        self.reach: Reach = oracle.reach
        spans = self.reach.of(start)  # each value's least dims, from the program's inputs
        self.classes = sorted(c for c in stored if c is not None and c in spans)
        self.bit = {c: 1 << i for i, c in enumerate(self.classes)}
        self.dims = [spans[c] for c in self.classes]
        self.nbytes = [nbytes * math.prod(class_sizes[d] for d in dims) for dims in self.dims]
        self.sizes = dict(class_sizes)
        self.target, self.max_inputs, self.max_outputs, self.max_grid = target, max_inputs, max_outputs, max_grid
        node_classes = dim_classes(program)
        splits: list[set[int]] = [set(d) for d in self.dims]  # classes a tensor of the value may be split along
        square: set[int] = set()  # values some node holds with one class on two dims
        for n in program.topological():
            cls = oracle.class_of(values[n.id][0])
            if cls in self.bit:
                i = self.classes.index(cls)
                own = [node_classes[(n.id, d)] for d in range(len(n.shape))]
                own = [c for c in own if c != NO_CLASS]
                splits[i] |= set(own)
                if len(own) != len(set(own)):
                    square.add(i)
        self.splits = [frozenset(s) for s in splits]
        self.square = square
        outputs = [oracle.output_class(k) for k in range(len(program.outputs))]
        self.complete = all(out in self.bit for out in outputs)  # else no path holds every output
        self.outputs = sum(self.bit[out] for out in set(outputs) if out in self.bit)
        # A library kernel applies one op: a value at most that op's height of e-nodes above what it
        # reads (per number of distinct reads; the builder's rewrites are `Reach`'s edges, one a layer).
        self.library_depth: dict[int, int] = {}
        alg = oracle.alg
        for n in program.topological():
            if n.op in library_ops and n.op not in costmodel.FREE_OPS:
                leaves = [(("inp", f"operand{k}"), values[i][1]) for k, i in enumerate(n.inputs)]
                height = _depth(alg.apply(n.op, leaves, n.attrs, [program.nodes[i].size_shape for i in n.inputs])[0])
                for arity in range(1, ops.OPS[n.op].arity + 1):
                    self.library_depth[arity] = max(self.library_depth.get(arity, 0), height)
        # Every e-class as a bit, and `Reach`'s rules and edges over them: (class made, its operands,
        # the dim class it reduces or None), for the closures of `_computable`.
        self._names = sorted(self.reach.classes)
        self._index = {c: i for i, c in enumerate(self._names)}
        bit = {c: 1 << i for c, i in self._index.items()}
        self._rules = [(bit[c], _bits(self._index[k] for k in kids), red) for c, kids, red in self.reach.rules] + \
            [(bit[d], bit[s], red) for s, d, red in self.reach.edges]
        self._constants = _bits(self._index[c] for c, kids, _ in self.reach.rules if not kids)
        self._may_write: dict[tuple[frozenset[str | None], frozenset[str | None], tuple[int, ...]], bool] = {}
        self._reads: list[int] = sorted(
            (sum(self.bit[c] for c in r) for n in range(1, max_inputs + 1) for r in combinations(self.classes, n)),
            key=self._bytes)
        self._read_bytes = {r: self._bytes(r) for r in self._reads}
        self._reach_masks: dict[int, int] = {}
        self._within: dict[int, list[tuple[int, float]]] = {}  # held -> its read sets and bytes, fewest first
        self._writes: dict[int, list[tuple[float, int]]] = {}  # held -> `_writable`
        self._floors: dict[tuple[int, int], float] = {}
        self._cheapest: dict[tuple[int, int], float] = {}
        self._least: dict[tuple[int, int], float] = {}  # (held, kernels) -> the least path
        self._lower: dict[tuple[int, int], float] = {}  # (held, kernels) -> a lower bound of it
        self._taint: dict[tuple[int, int, int], int] = {}
        self._layers: dict[tuple[int, int], int] = {}

    @classmethod
    def of(cls, program: Program, oracle: Oracle, values: Mapping[str, tuple[AE, Any]], start: Mapping[str, Dims],
           stored: frozenset[str | None] | None, class_sizes: Mapping[int, int], nbytes: int, target: Target | None,
           max_inputs: int, max_outputs: int, max_grid: int, library_ops: Sequence[str]) -> ValuePaths | None:
        """The paths of a program, or None where they bound nothing: any tensor may hold any value
        (`stored` None), no cost model, or too many values to walk their sets."""
        if stored is None or target is None or len(stored) > MAX_VALUES:
            return None
        paths = cls(program, oracle, values, start, stored, class_sizes, nbytes, target, max_inputs, max_outputs,
                    max_grid, library_ops)
        return paths if paths.complete else None

    # -- sets of values --------------------------------------------------------------------------
    def held(self, classes: Sequence[str | None]) -> int | None:
        """The mask of these values; None when one is not a stored program value."""
        mask = 0
        for c in classes:
            if c not in self.bit:
                return None
            mask |= self.bit[c]
        return mask

    def _members(self, mask: int) -> list[int]:
        return [i for i in range(len(self.classes)) if mask >> i & 1]

    def _bytes(self, mask: int) -> float:
        return sum(self.nbytes[i] for i in self._members(mask))

    def _reachable(self, reads: int) -> int:
        """The stored values a kernel reading these can compute (`Reach.of`), as a mask."""
        hit = self._reach_masks.get(reads)
        if hit is None:
            found = self.reach.of({self.classes[i]: self.dims[i] for i in self._members(reads)})
            hit = self._reach_masks[reads] = sum(self.bit[c] for c in found if c in self.bit)
        return hit

    # -- one kernel ------------------------------------------------------------------------------
    def _kernel_floor(self, reads: int, writes: int) -> float:
        """The least time of a kernel reading these values and writing those: a graph kernel
        (`costmodel.whole_reduction_floor` over the axes its outputs allow and the inputs each
        axis may split, `_splits`), or for one value a library op computes, a launch and the bytes."""
        key = (reads, writes)
        hit = self._floors.get(key)
        if hit is not None:
            return hit
        ins, outs = self._members(reads), self._members(writes)
        written = self._bytes(writes)
        common = frozenset.intersection(*(self.splits[w] for w in outs))
        options: list[tuple[frozenset[int], int]] = [(frozenset({c}), self.sizes[c]) for c in sorted(common)]
        if len(outs) > 1:  # side by side: one class of each output, none of all, each of one input only
            owners = Counter(c for x in ins for c in self.splits[x])
            picks = {frozenset(pick) for pick in product(*(sorted(self.splits[w] - common) for w in outs))
                     if len(set(pick)) > 1 and all(owners[c] == 1 for c in pick)}
            options += [(a, math.gcd(*(self.sizes[c] for c in a))) for a in sorted(picks, key=sorted)]
        # Per axis, the sets of inputs it may split together (one set of one class each side by side).
        choices = [self._split_sets(reads, next(iter(axis)), writes) if len(axis) == 1 else
                   [sum(1 << x for x in ins if any(self._splits(reads, 1 << x, c, writes)
                                                   for c in axis & self.splits[x]))]
                   for axis, _ in options]
        axes = [(frozenset({k}), size) for k, (_, size) in enumerate(options)]
        floor = math.inf
        for split in product(*choices):
            read_floors = [(self.nbytes[x], frozenset(k for k, m in enumerate(split) if m >> x & 1)) for x in ins]
            floor = min(floor, costmodel.whole_reduction_floor(self.target, read_floors, written, axes, self.max_grid))
        depth = self.library_depth.get(len(ins))
        if len(outs) == 1 and depth is not None and writes & self._layered(reads, depth):
            floor = min(floor, self.target.launch_overhead_s + (self._bytes(reads) + written)
                        / self.target.dram_bytes_per_s)
        self._floors[key] = floor
        return floor

    def _split_sets(self, reads: int, c: int, writes: int) -> list[int]:
        """The largest sets of inputs (masks) that one grid axis over class c may split together
        (`_splits`): two inputs may each be split where the other computes a sum over c, and not
        both (K and its norm, under softmax's row sums)."""
        able = [x for x in self._members(reads) if c in self.splits[x]]
        found: list[int] = []
        for n in range(len(able), 0, -1):
            for group in combinations(able, n):
                split = sum(1 << x for x in group)
                if not any(split & ~f == 0 for f in found) and self._splits(reads, split, c, writes):
                    found.append(split)
        return found or [0]

    def _splits(self, reads: int, split: int, c: int, writes: int) -> bool:
        """May these inputs (a mask) all be split along class c, each block computing `writes`
        from its parts? Not where every way of computing them reduces over c something computed
        from one of them: a block then holds a part of that sum, a partial result no narrow
        tensor stores. (A value with one class on two dims may be split along one and reduced
        along the other: it constrains nothing.)"""
        split &= ~sum(1 << x for x in self.square)
        if not split:
            return True
        taint = self._taint.get((reads, split, c))
        if taint is None:
            taint = self._taint[(reads, split, c)] = self._tainted(reads, split, c)
        return self._eclasses(writes) & ~taint == 0

    def _tainted(self, reads: int, split: int, c: int) -> int:
        """The e-classes a kernel reading these values can compute when no reduction over class c
        may read anything computed from the values `split` (`Reach` with those e-nodes left out):
        each such e-node's operands must be computable without them."""
        free = _bits(self._index[k] for k in self.reach.of(
            {self.classes[i]: self.dims[i] for i in self._members(reads & ~split)})) if reads & ~split else 0
        return self._computable(self._eclasses(reads), c, free)

    def _eclasses(self, values: int) -> int:
        """These stored values (a mask of `classes`) as a mask of e-classes."""
        return _bits(self._index[self.classes[i]] for i in self._members(values))

    def _computable(self, start: int, c: int | None = None, free: int = 0) -> int:
        """The e-classes (a mask) computable from those of `start` and constants (`Reach.of`
        without dims); with class `c`, no reduction over c reads an e-class outside `free`."""
        have = start | self._constants
        changed = True
        while changed:
            changed = False
            for made, operands, red in self._rules:
                if not made & have and operands & ~have == 0 and (c is None or red != c or operands & ~free == 0):
                    have |= made
                    changed = True
        return have

    def _layered(self, reads: int, depth: int) -> int:
        """The stored values at most `depth` e-nodes (or the builder's rewrites) above these."""
        key = (reads, depth)
        hit = self._layers.get(key)
        if hit is None:
            have = self._eclasses(reads) | self._constants
            for _ in range(depth):
                new = have
                for made, operands, _ in self._rules:
                    if operands & ~have == 0:
                        new |= made
                if new == have:
                    break
                have = new
            hit = self._layers[key] = sum(self.bit[name] for k, name in enumerate(self._names)
                                          if have >> k & 1 and name in self.bit)
        return hit

    def cheapest(self, held: int, writes: int) -> float:
        """The least time of a kernel writing `writes` from values of `held` (inf if none can)."""
        key = (held, writes)
        hit = self._cheapest.get(key)
        if hit is not None:
            return hit
        best = math.inf
        written = self._bytes(writes)
        for reads, read in self._subsets(held):
            if self._moving(read + written) >= best:
                break  # fewest bytes first: no later read set moves less
            if writes & ~self._reachable(reads) == 0:
                best = min(best, self._kernel_floor(reads, writes))
        self._cheapest[key] = best
        return best

    def _moving(self, nbytes: float) -> float:
        """A launch and these bytes at full bandwidth: below every kernel's floor."""
        return self.target.launch_overhead_s + nbytes / self.target.dram_bytes_per_s

    def _subsets(self, held: int) -> list[tuple[int, float]]:
        """The read sets within `held`, with their bytes, fewest first."""
        hit = self._within.get(held)
        if hit is None:
            hit = self._within[held] = [(r, self._read_bytes[r]) for r in self._reads if r & ~held == 0]
        return hit

    # -- paths -----------------------------------------------------------------------------------
    def _writable(self, held: int) -> list[tuple[float, int]]:
        """Every set of at most `max_outputs` values one kernel can write from `held`, with the
        least time of any kernel writing it (`_moving`), least first."""
        hit = self._writes.get(held)
        if hit is None:
            subsets = self._subsets(held)
            can = 0
            for reads, _ in subsets:
                can |= self._reachable(reads)
            fewest = subsets[0][1] if subsets else 0.0
            hit = self._writes[held] = sorted((self._moving(fewest + self._bytes(w)), w) for w in self._sets(can))
        return hit

    def _sets(self, mask: int) -> list[int]:
        members = self._members(mask)
        return [sum(1 << i for i in w) for n in range(1, self.max_outputs + 1) for w in combinations(members, n)]

    def least(self, held: int, kernels: int, budget: float = math.inf) -> float:
        """The least time of `kernels` kernels that start from the values `held` and end holding
        every program output, the last writing those still missing (and no others), where it is
        at most `budget`; above it, a lower bound above `budget` (fail-soft: a path over budget
        is not completed, its partial sum bounds it)."""
        key = (held, kernels)
        if (exact := self._least.get(key)) is not None:
            return exact
        if (lower := self._lower.get(key, -math.inf)) > budget:
            return lower
        if kernels == 1:
            missing = self.outputs & ~held
            best = min((self.cheapest(held, w) for w in self._sets(self.outputs) if w & missing == missing),
                       default=math.inf)
            self._least[key] = best
            return best
        rest = (kernels - 1) * self.target.launch_overhead_s  # each later kernel launches
        best, bound = math.inf, math.inf  # the least complete path; the least of those cut short
        for moving, writes in self._writable(held):
            limit = min(best, budget)
            if moving + rest > limit:
                bound = min(bound, moving + rest)
                break  # least first: none after it fits either
            first = self.cheapest(held, writes)
            if first + rest > limit:
                bound = min(bound, first + rest)
                continue
            after = self.least(held | writes, kernels - 1, limit - first)
            if after <= limit - first:
                best = first + after
            else:
                bound = min(bound, first + after)
        if best <= bound:
            self._least[key] = best
            return best
        self._lower[key] = max(lower, bound)
        return bound

    def after(self, held: int, reads: int, kernels: Sequence[int], budget: float = math.inf,
              writes: int | None = None) -> float:
        """The least time of a kernel reading exactly the values `reads` of `held` (and writing
        exactly `writes`, when given), then any of these numbers of kernels more (as `least`,
        fail-soft above `budget`)."""
        best, bound = math.inf, math.inf
        rest = min(kernels, default=0) * self.target.launch_overhead_s
        read = self._bytes(reads)
        for w in sorted(self._sets(self._reachable(reads)), key=self._bytes) if writes is None else [writes]:
            limit = min(best, budget)
            moving = self._moving(read + self._bytes(w))
            if moving + rest > limit:
                bound = min(bound, moving + rest)
                break
            own = self._kernel_floor(reads, w)
            if own + rest > limit:
                bound = min(bound, own + rest)
                continue
            for k in kernels:
                rest_k = self.least(held | w, k, min(best, budget) - own)
                if rest_k <= min(best, budget) - own:
                    best = own + rest_k
                else:
                    bound = min(bound, own + rest_k)
        return min(best, bound)

    def writable(self, held: int, reads: int, kernels: Sequence[int], budget: float) -> tuple[int, ...]:
        """The sets of values a kernel reading exactly `reads` of `held` may write and still lead
        to a graph of one of these numbers of kernels more within `budget` (`after`): what a
        block graph of that kernel must write, as masks."""
        return tuple(w for w in self._sets(self._reachable(reads))
                     if self.after(held, reads, kernels, budget, w) <= budget)

    # -- what a graph over some values may write ------------------------------------------------
    def may_write(self, sources: Sequence[str | None], kept: Sequence[str | None], writes: Sequence[int]) -> bool:
        """May a graph that reads values of these e-classes write exactly one of these sets of
        values (masks) and read every source on the way (each one it reads is written or feeds
        a value written) and write the `kept` ones as they are (no op reads them)? A post-loop
        graph over a loop body's accumulators (`kept`: those that gather an unreduced tile) must:
        a body none of whose post-loop graphs writes what a later path needs is cut whole.
        A source of no e-class (unknown) may feed anything: True."""
        if any(c not in self._index for c in (*sources, *kept)):
            return True
        key = (frozenset(sources), frozenset(kept), tuple(writes))
        hit = self._may_write.get(key)
        if hit is None:
            hit = self._may_write[key] = self._writes_from(
                _bits(self._index[c] for c in sources), _bits(self._index[c] for c in kept), writes)
        return hit

    def _writes_from(self, sources: int, kept: int, writes: Sequence[int]) -> bool:
        have = self._computable(sources | kept)
        for w in writes:
            target = self._eclasses(w)
            if target & ~have or kept & ~target:
                continue  # not computable from them, or a kept source not written
            # The e-classes on some way to a written value: an operand of an e-node on that way
            # whose operands are all computable.
            feeding = target
            changed = True
            while changed:
                changed = False
                for made, operands, _ in self._rules:
                    if made & feeding and operands & ~have == 0 and operands & ~feeding:
                        feeding |= operands
                        changed = True
            if sources & ~feeding == 0:
                return True
        return False
