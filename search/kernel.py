"""Kernel-level generation: kernel graphs of library kernels and graph-defined kernels.

Depth-first, one kernel at a time, in a canonical order (a kernel's key — its newest input
tensor, its inputs, its kind and body — exceeds the previous kernel's), with at most
`max_kernel_ops` kernels. A library kernel runs one program op (with the program's attributes); a
graph kernel comes from the block-level generator (`search.block`) over 1..`max_block_inputs`
existing tensors, each of its resolved tilings a separate move. A tensor holding per-chunk
partial results may only feed a graph kernel whose loop is tied to its chunk axis (which merges
the chunks). Every new tensor's abstract expression must be in the target's e-graph, and a tensor
repeating an existing one (same expression, shape and chunking) is cut.

A state is a candidate when, for every program output, some tensor has its shape and an abstract
expression equal to the output's, and every kernel contributes to those outputs. States are
explored by iterative deepening on the number of kernels, so the search is anytime: schedules with
fewer launches are found first. The one-kernel search starts with the program itself as one block
graph (`Generator.program_graphs`: a fused candidate, and a bound, after a state per op). Within a
depth, first kernels over more inputs come first (fusion first), and each shard walks its subtree
twice: graphs whose last kernel only combines computed tensors, then those whose last kernel reads
program inputs again; from three kernels on, all that first with a library second kernel, then
with a graph-defined one (see `candidates_in`).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import combinations, product
from typing import Any

from superopt import costmodel, ops
from superopt.assignments import bounded_candidates, divisors
from superopt.config import SearchConfig
from superopt.dimclasses import NO_CLASS, dim_classes, input_classes
from superopt.dtypes import dtype as get_dtype
from superopt.object_cache import BoundedDict, ObjectCache
from superopt.primitives import apply
from superopt.program import Node, Program, Tensor
from superopt.search.block import MAX_OUTPUTS, BlockState, Body, Generator, InputSpec, Lazy
from superopt.search.fingerprint import fingerprint, random_inputs
from superopt.search.space import Space
from superopt.search.tiling import PLAN_ENTRIES, Chunk, Plans, resolve, resolve_fixed
from superopt.search.views import ProgramViews
from superopt.sgraph import GraphKernel, Kernel, LibraryKernel, SGraph, SGraphError, TensorDecl, analyze
from superopt.sizes import Size
from superopt.targets import Target
from superopt.verifier.oracle import AE, RESHAPED, C, Oracle, abstract_program


@dataclass(frozen=True)
class KTensor:
    id: str
    shape: tuple[Size, ...]
    ae: AE
    classes: tuple[int, ...]  # program dim class of each dim
    chunk: Chunk | None = None

    @cached_property
    def leaves(self) -> frozenset[str]:
        """The program inputs its value reads (asked of the same tensors in state after state)."""
        return frozenset(_leaves(self.ae))


@dataclass(frozen=True)
class KState:
    tensors: tuple[KTensor, ...]
    kernels: tuple[Kernel, ...]
    last_key: tuple[Any, ...]
    graph_kernels: int = 0


@dataclass(frozen=True)
class FirstKernel:
    """A state of one first kernel (not the last), ranked among those computing the same values
    (`undominated`): its least estimated time per chunk count and its prefix sGraph's text;
    `floors` is None when not known (then it is never cut)."""

    state: KState
    floors: dict[int, float] | None
    text: str


Sink = tuple[AE, tuple[Size, ...], tuple[int, ...]]  # a block output: expression, full shape, program dim classes
FirstChoice = tuple[str, Any]  # ("library", move key) | ("graph" | "program", input tensor indices)
TIE = 1e-9  # relative difference of estimates below which two are the same (float sums differ in order)
MIDDLES = ("library", "graph")  # kinds of second kernel, in the order graphs of 3+ kernels are grown
BLOCK_CACHE_ENTRIES = 256  # input combinations whose block graphs are kept (least recently used go)
BLOCK_CACHE_STATES = 100_000  # block graphs kept in all (beyond those of the combination being generated)
FLOOR_ENTRIES = 1 << 17  # kernels, and sets of kernels, whose least estimated times are kept
SPLIT_KEEP = 8  # partial schedules kept from one part of `program_split` to the next (the cheapest)


class BudgetExhausted(Exception):
    """The search ran out of time or states (the caller keeps the best found so far)."""


@dataclass
class KernelSearch:
    program: Program
    space: Space
    oracle: Oracle
    config: SearchConfig
    deadline: float = float("inf")  # wall-clock time.time(), comparable across worker processes
    max_states: int | None = None
    states: int = 0
    pruned: int = 0
    block_cache: dict[tuple[Any, ...], Lazy[BlockState]] = field(default_factory=dict)
    on_state: Callable[[KernelSearch], None] | None = None
    deepen: Callable[[int], bool] | None = None
    # Branch and bound: graphs that must take longer than `bound_s` on `target` are not built.
    # Kernels already chosen take at least the cost model's best time for them alone; every
    # kernel to come costs a launch plus the bytes of the tensors it reads and writes at full
    # bandwidth (the cost model never charges less).
    bound_s: float = float("inf")
    target: Target | None = None
    bandwidth: float = field(init=False, default=float("inf"))  # DRAM bytes per second
    launch_s: float = field(init=False, default=0.0)
    bounded: int = 0  # graphs cut by the bound (they might win at another shape)
    keep: int = 1  # first kernels kept per computation (`undominated`): the driver's contenders
    views: ProgramViews | None = None  # the views the searched program leaves out (estimates read them as stored)
    _gen: Generator | None = None

    def __post_init__(self) -> None:
        if self.target is not None:
            self.bandwidth, self.launch_s = self.target.dram_bytes_per_s, self.target.launch_overhead_s
        self._first_kernels: dict[tuple[FirstChoice, tuple[int, int]], list[FirstKernel]] = {}  # see first_kernels
        # kernel and input shapes (`_floor_key`) -> `_floors`
        self._kernel_floors: BoundedDict[bytes, dict[int, float]] = BoundedDict(FLOOR_ENTRIES)
        self._floor_parts: BoundedDict[tuple[bytes, ...], tuple[float, dict[int, float] | None]] = BoundedDict(
            FLOOR_ENTRIES)  # see `_parts`
        self._digests: ObjectCache[Kernel, bytes] = ObjectCache(4096)  # kernel -> `_digest`
        self._plans: Plans = ObjectCache(PLAN_ENTRIES)  # block graph -> its tilings (see `resolve`)
        self._inputs = random_inputs(self.program)  # small random program inputs for `_fingerprint`
        self._gen = Generator(self.space, self.oracle, self.config.max_block_ops, on_state=self._tick,
                              no_loop_tilings=not self.config.concrete,
                              max_outputs=max(MAX_OUTPUTS, len(self.program.outputs)))
        self._alg = self.oracle.alg
        self._outputs = [self.program.nodes[o] for o in self.program.outputs]
        classes = dim_classes(self.program)
        self._class_sizes = {c: self.program.nodes[n].shape[d] for (n, d), c in classes.items() if c != NO_CLASS}
        # `_after_middle` follows values through the e-graph by their dim classes, which a
        # reshape does not keep.
        self._reach = self.target is not None and all(n.op != "reshape" for n in self.program.nodes.values())
        self._output_classes = [tuple(classes[(o, d)] for d in range(len(self.program.nodes[o].shape)))
                                for o in self.program.outputs]
        self._whole_floors: dict[tuple[Any, ...], float] = {}  # last kernel's inputs -> `_whole_floor`
        self._middle_owns: dict[tuple[Any, ...], float] = {}  # a middle kernel's inputs -> `_middle_own`
        self._free_kernels = self.space.free_kernels != 0  # a kernel to come may be a free view
        # Each grid axis splits a divisor of a program dim: the least latency of a loop iteration.
        self._iteration_s = 0.0 if self.target is None else costmodel.iteration_floor(
            self.target, _block_counts(self.program, self.config.max_grid_axes))
        values = self._values = abstract_program(self.program)
        self._nbytes = min(get_dtype(n.dtype or "f32").nbytes for n in self.program.inputs)
        self._output_bytes = [self._bytes(KTensor(n.id, n.size_shape, ("c",), ())) for n in self._outputs]
        self._target_leaves = [_leaves(values[o][0]) for o in self.program.outputs]  # see `_inputs_of`
        self._library_attrs: dict[str, list[dict[str, Any]]] = {}
        for n in self.program.topological():
            if n.op in ("input", "const"):
                continue
            entry = self._library_attrs.setdefault(n.op, [])
            if dict(n.attrs) not in entry:
                entry.append(dict(n.attrs))

    def forget(self) -> None:
        """Break the reference cycles that keep a finished search alive (`Generator.forget`, the
        lazily generated block graphs, the progress callback)."""
        assert self._gen is not None
        self._gen.forget()
        self.block_cache.clear()
        self.on_state = None

    # -- budget ----------------------------------------------------------------------------------
    @property
    def total_states(self) -> int:
        assert self._gen is not None
        return self.states + self._gen.states

    @property
    def total_pruned(self) -> int:
        assert self._gen is not None
        return self.pruned + self._gen.pruned

    def _tick(self) -> None:
        if self.on_state is not None:
            self.on_state(self)
        if time.time() > self.deadline:
            raise BudgetExhausted("time")
        if self.max_states is not None and self.total_states >= self.max_states:
            raise BudgetExhausted("states")

    # -- the walk ------------------------------------------------------------------------------
    def initial(self) -> KState:
        classes = input_classes(self.program)
        tensors = tuple(KTensor(n.id, n.size_shape, ("inp", n.id), classes[n.id]) for n in self.program.inputs)
        return KState(tensors, (), ())

    def candidates(self) -> Iterator[SGraph]:
        """Every candidate sGraph, fewest kernels first (iterative deepening over the kernel count:
        one-kernel answers come before any deeper branch is explored). `deepen(depth)` may stop
        the deepening (when no schedule of that many kernels can beat the best found)."""
        for depth in range(1, self.config.max_kernel_ops + 1):
            if self.deepen is not None and not self.deepen(depth):
                return
            for choice in self.first_choices(depth):
                yield from self.candidates_in(depth, choice)

    # -- shards ------------------------------------------------------------------------------
    def first_choices(self, depth: int) -> list[FirstChoice]:
        """The ways to choose the first kernel of a depth-`depth` graph, in canonical order: a
        library op on given tensors, or a graph kernel over a given set of tensors. Each choice's
        subtree is one shard of the search (`candidates_in`)."""
        root = self.initial()
        final = depth == 1
        library: list[FirstChoice] = [("library", s.last_key) for s in self._library_moves(root, final)]
        needed = self._inputs_of(self._missing(root)) if final else set()
        graphs: list[FirstChoice] = []
        for size in range(1, self.config.max_block_inputs + 1):
            for subset in combinations(range(len(root.tensors)), size):
                if not final or needed <= set().union(*(root.tensors[i].leaves for i in subset)):
                    graphs.append(("graph", subset))
        if final:
            # First, the program itself as one block graph (`Generator.program_graphs`): one
            # state per op, so any program that fits one kernel has a fused candidate at once.
            whole = tuple(range(len(root.tensors)))
            program = [("program", whole)] if len(whole) <= self.config.max_block_inputs and \
                not self.config.concrete else []
            return program + library + graphs
        # Fusion first: a first kernel over more of the inputs can do more of the work, leaving the
        # later kernels small; one library op leaves the most. (The order only decides what an
        # exhausted budget has seen: every shard is searched when time allows.)
        graphs.sort(key=lambda c: -len(c[1]))
        return graphs + library

    def body_part(self, choice: FirstChoice, part: tuple[int, int]) -> list[Body]:
        """A part of the loop bodies of a graph choice's first kernel (`Generator.body_part`)."""
        assert self._gen is not None
        return self._gen.body_part(self._first_start(choice), part)

    def adopt_bodies(self, choice: FirstChoice, bodies: Sequence[Body], part: tuple[int, int]) -> None:
        """Use these loop bodies (all parts of `body_part`) for a part of the choice's first kernel."""
        assert self._gen is not None
        self._gen.adopt_bodies(self._first_start(choice), bodies, part)

    def _first_start(self, choice: FirstChoice) -> BlockState:
        assert self._gen is not None and choice[0] == "graph"
        root = self.initial()
        return self._gen.start([self._spec(root.tensors[i], i, False) for i in choice[1]])

    def candidates_in(
        self, depth: int, choice: FirstChoice, part: tuple[int, int] = (1, 0), firsts: Sequence[KState] | None = None,
        middle: str | None = None,
    ) -> Iterator[SGraph]:
        """Candidates of `depth` kernels whose first kernel is `choice`; `part` splits the first
        kernel's block graphs among workers (see Generator.complete_graphs), or after a library
        first kernel the second kernel's. `firsts` (a graph choice of more than one kernel) are
        first kernels dealt out by the driver (`first_kernels`, undominated across every part):
        grown instead of generating the first kernel's block graphs. `middle` ("library" or
        "graph", from three kernels on) keeps the graphs whose second kernel is of that kind."""
        root = self.initial()
        self.states += 1
        self._tick()
        final = depth == 1
        if choice[0] == "program":
            for state in self._graph_moves(root, final, only=choice[1], program=self.program):
                yield from self._at_depth(state, depth)
            return
        if firsts is not None:
            states = list(firsts)
        elif choice[0] == "library":
            if final and part[1] != 0:
                return  # one kernel: nothing after it to split, the first part has it
            states = [s for s in self._library_moves(root, final) if s.last_key == choice[1]]
        elif final:
            for state in self._graph_moves(root, final, only=choice[1], part=part):
                yield from self._at_depth(state, depth)
            return
        else:
            states = [f.state for f in self.first_kernels(choice, part)]
        if final:
            for state in states:
                yield from self._at_depth(state, depth)
            return
        # Two passes over the same subtrees. First the graphs whose last kernel reads computed
        # tensors only (a merge of partial results, a division: small block spaces), then those
        # whose last kernel reads program inputs again (the large spaces, as large as a whole
        # one-kernel search). Same candidates; the cheap ones are not queued behind the costly.
        # From three kernels on, the same again for a second kernel that is a library op (a few
        # moves), then a graph kernel (whole block spaces, one per first kernel): a graph of
        # cheap middle kernels that wins tightens the bound before the costly ones are generated.
        second = part if choice[0] == "library" and firsts is None else (1, 0)  # graph ones were split already
        for kind in MIDDLES if depth >= 3 and middle is None else (middle,):
            for rereads in (False, True):
                for state in states:
                    yield from self._at_depth(state, depth, rereads, second, kind)

    def first_kernels(self, choice: FirstChoice, part: tuple[int, int] = (1, 0)) -> list[FirstKernel]:
        """A graph choice's first kernels for deeper graphs (not the last kernel), from this part of
        its block graphs, without those that `keep` others beat (`undominated`); kept, as deeper
        graphs start the same way. The driver gathers every part's, cuts those beaten across parts
        (`undominated`) and deals them out to the shards of deeper graphs."""
        key = (choice, part)
        if key not in self._first_kernels:
            states = list(self._graph_moves(self.initial(), False, only=choice[1], part=part))
            self._first_kernels[key] = self.undominated([self._ranked_first(st) for st in states])
        return self._first_kernels[key]

    def program_split(self) -> list[SGraph]:
        """Schedules of a program too large for one kernel, cut into consecutive parts (canonical
        order) that each fit one: every part one graph kernel computing it as `Generator.program_graphs`
        does the whole program, grown part by part from the `SPLIT_KEEP` cheapest (`_spent`). A
        fused schedule at once, and a bound, where the one-kernel search may outlast any budget (a
        12-op chain over two inputs). Empty when the program fits one kernel, or an op is not a
        block op, or some part cannot be cut."""
        parts = self._program_parts()
        if len(parts) < 2:
            return []
        states = [self.initial()]
        for nodes in parts:
            grown = [nxt for st in states for nxt in self._part_moves(st, nodes)]
            states = sorted(grown, key=self._spent)[:SPLIT_KEEP]
        return [sg for st in states if (sg := self._candidate(st)) is not None]

    def _program_parts(self) -> list[list[Node]]:
        """The program's ops cut greedily into consecutive runs of at most `max_block_ops` ops, at
        most `max_block_inputs` tensors read from outside and at most `Generator.max_outputs` values read
        after them (or returned), each of which nothing in its own run reads (a block graph writes
        its sinks); one run when the program fits one kernel, none when it cannot be cut."""
        ops_ = [n for n in self.program.topological() if n.op not in ("input", "const")]
        if any(n.op not in self.space.block_ops for n in ops_):
            return []
        parts: list[list[Node]] = []
        start = 0
        while start < len(ops_):
            ends = range(min(len(ops_), start + self.config.max_block_ops), start, -1)
            end = next((e for e in ends if self._one_part(ops_[start:e], ops_[e:])), None)
            if end is None:
                return []
            parts.append(ops_[start:end])
            start = end
        return parts

    def _one_part(self, nodes: list[Node], after: list[Node]) -> bool:
        ids = {n.id for n in nodes}
        outside = {i for n in nodes for i in n.inputs if i not in ids and self.program.nodes[i].op != "const"}
        read_later = {i for n in after for i in n.inputs} | set(self.program.outputs)
        outputs = [n for n in nodes if n.id in read_later]
        read_here = {i for n in nodes for i in n.inputs}
        assert self._gen is not None
        return (len(outside) <= self.config.max_block_inputs and 1 <= len(outputs) <= self._gen.max_outputs
                and not any(n.id in read_here and n.id not in self.program.outputs for n in outputs))

    def _part_moves(self, s: KState, nodes: list[Node]) -> Iterator[KState]:
        """`s` and one graph kernel computing these program nodes from the tensors of `s` that
        hold their operands (as `_program_parts` cut them)."""
        ids = {n.id for n in nodes}
        held: dict[str, int] = {}
        for i in (i for n in nodes for i in n.inputs if i not in ids and self.program.nodes[i].op != "const"):
            node, cls = self.program.nodes[i], self.oracle.class_of(self._values[i][0])
            match = next((k for k, t in enumerate(s.tensors) if t.chunk is None and t.shape == node.size_shape
                          and cls is not None and self.oracle.class_of(t.ae) == cls), None)
            if match is None:
                return
            held[i] = match
        part = Program(f"{self.program.name}.part")
        name = {i: s.tensors[k].id for i, k in held.items()}  # inputs: the tensors' ids; ops: the builder's
        for i in sorted(held, key=held.__getitem__):
            node = self.program.nodes[i]
            part.input(name[i], node.shape, node.dtype or "f32")
        for n in nodes:
            operands = [float(self.program.nodes[i].attrs["value"]) if self.program.nodes[i].op == "const"
                        else Tensor(part, name[i]) for i in n.inputs]
            name[n.id] = part.op(n.op, *operands, **dict(n.attrs)).id
        read_later = {i for m in self.program.topological() if m.id not in ids for i in m.inputs}
        part.outputs = [name[n.id] for n in nodes if n.id in read_later or n.id in self.program.outputs]
        subset = tuple(sorted(held.values()))
        # No canonical order between parts: this kernel may read older tensors than the last one.
        for nxt in self._graph_moves(KState(s.tensors, s.kernels, (), s.graph_kernels), False, only=subset,
                                     program=part):
            if all(t.chunk is None for t in nxt.tensors[len(s.tensors):]):
                yield nxt

    def _at_depth(
        self, state: KState, depth: int, rereads: bool | None = None, part: tuple[int, int] = (1, 0),
        middle: str | None = None,
    ) -> Iterator[SGraph]:
        """Candidates of `depth` kernels grown from `state`; `part` splits the next kernel's moves
        (a library first kernel's shard is split at its second kernel); `middle` ("library" or
        "graph") keeps second kernels of that kind when the second is not the last."""
        self.states += 1
        self._tick()
        left = depth - len(state.kernels)
        if left and self.bound_s < float("inf"):
            # The kernels so far, the launches to come and what they must move take too long?
            # Asked first of what is known without analyzing a new kernel (`_known_spent`).
            launches = self.space.launches(left) * self.launch_s
            owed = self._owed(state)(()) / self.bandwidth
            if launches + owed + self._known_spent(state) > self.bound_s or launches + max(
                    self._spent(state) + owed,
                    self._merged_later(state, lambda chunks: chunks * self._iteration_s)) > self.bound_s:
                self.pruned += 1
                self.bounded += 1
                return
        if len(state.kernels) == depth:
            cand = self._candidate(state)
            if cand is not None:
                yield cand
            return
        if state.kernels and not self._missing(state):
            # Every output is computed already: further kernels could only recompute one from it,
            # the same graph with more launches (the shallower depth has the graph without them).
            self.pruned += 1
            return
        final = len(state.kernels) == depth - 1
        kind = middle if len(state.kernels) == 1 and not final else None
        later = depth - len(state.kernels) - 1
        for nxt in self.moves(state, final=final, rereads=rereads if final else None, part=part, kind=kind,
                              later=later):
            yield from self._at_depth(nxt, depth, rereads)

    def moves(
        self, s: KState, final: bool = False, rereads: bool | None = None, part: tuple[int, int] = (1, 0),
        kind: str | None = None, later: int = 0,
    ) -> Iterator[KState]:
        """Successor states. For the last kernel of a depth, only kernels that complete the
        program's outputs are worth building: their new tensors must match what is missing.
        `rereads` (last kernel only) keeps the kernels that do (True) or do not (False) read a
        program input; None keeps both. `part` = (parts, index) keeps this part's share: the
        library kernels go to the first part, graph-defined ones by their block graphs. `kind`
        ("library" or "graph") keeps kernels of that kind only. `later`: kernels to come after
        this one (graph kernels whose graphs cannot beat the bound are then not generated)."""
        if part[1] == 0 and kind != "graph":
            yield from self._library_moves(s, final, rereads)
        if kind != "library":
            yield from self._graph_moves(s, final, part=part, rereads=rereads, later=later)

    def _bytes(self, t: KTensor) -> float:
        """The fewest bytes tensor `t` can have (a chunked dim counts one chunk)."""
        dims = [d.int_value() if d.is_const() else 1 for d in t.shape]
        if t.chunk is not None:
            dims[t.chunk.dim] = t.chunk.base
        return math.prod(dims) * self._nbytes

    def _spent(self, s: KState) -> float:
        """The least time the kernels of `s` take: launches, and reading and writing their tensors;
        once there is a bound, the cost model's estimate of these kernels alone at their best
        sizes (`inf` when no sizes are valid: no graph that contains them can be instantiated)."""
        size = {t.id: self._bytes(t) for t in s.tensors}
        total = sum(self._moving_s(k, size) for k in s.kernels)
        if self.bound_s == float("inf") or self.target is None or not s.kernels:
            return total
        return max(total, self._estimated(s))

    def _moving_s(self, k: Kernel, size: dict[str, float]) -> float:
        """A kernel's launch and the bytes it reads and writes at full bandwidth (0 for a free one:
        a launch argument, a view), below the cost model's estimate of it at any sizes."""
        if isinstance(k, LibraryKernel) and k.op in costmodel.FREE_OPS:
            return 0.0
        moved = sum(size[i] for i in k.tensor_inputs) + sum(size[o] for o in k.outputs)
        return self.launch_s + moved / self.bandwidth

    def _known_spent(self, s: KState) -> float:
        """A lower bound of `_spent` that analyzes no kernel: each kernel's kept least time
        (`_floors`), or, for one not met before, its launch and bytes (`_moving_s`, below its
        least time). Most middle kernels that the bound cuts are cut by this alone (their output
        must be written and read again), without the analysis of their block graph (~3 ms)."""
        size = {t.id: self._bytes(t) for t in s.tensors}
        total = 0.0
        for k in s.kernels:
            floors = self._kernel_floors.get(self._floor_key(s, k)) if self.target is not None else None
            total += self._moving_s(k, size) if floors is None else min(floors.values(), default=math.inf)
        return total

    def _estimated(self, s: KState) -> float:
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
        apart (for `_merged_later`; None otherwise). (0, None) when the estimates are not known."""
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
        decls.update((n.id, TensorDecl(n.id, n.shape, n.dtype or "f32")) for n in self.program.inputs
                     if n.id in read and all(v.output != n.id for v in views))
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
        """What a kernel's floors depend on: the kernel and the shapes of its inputs."""
        return self._digest(k) + repr([t.shape for t in s.tensors if t.id in k.tensor_inputs]).encode()

    def _digest(self, k: Kernel) -> bytes:
        """A 128-bit digest of repr(k), the key of a kernel's floors: kept per kernel object
        (states grown from one kernel share the object; a block graph's repr is slow). A digest,
        not the text: the floors of a long search are kept for some 100,000 kernels, whose
        texts take a kilobyte or more each."""
        return self._digests.get(k, None, lambda: hashlib.blake2b(repr(k).encode(), digest_size=16).digest())

    def _ranked_first(self, st: KState) -> FirstKernel:
        """`st` with what ranks it among the first kernels computing the same values."""
        prefix = self._prefix(st) if self.target is not None else None
        if prefix is None:
            return FirstKernel(st, None, "")
        return FirstKernel(st, self._floors(st, *prefix, st.kernels[0]), prefix[0].dumps())

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
        return sum(self._output_bytes[i] for i in self._missing(s))

    def _last_kernel_floor(self, s: KState) -> float:
        """The least time of `s` plus a last kernel that writes the missing outputs (before the
        bytes that last kernel reads); 0 when there is no bound, so nothing is cut."""
        if self.bound_s == float("inf"):
            return 0.0
        return self._spent(s) + self.launch_s + self._unwritten(s) / self.bandwidth

    def _too_slow(self, s: KState, floor_s: float, inputs: Sequence[int]) -> bool:
        """Would any last library kernel reading these tensors exceed the bound?"""
        too_slow = floor_s + sum(self._bytes(s.tensors[i]) for i in set(inputs)) / self.bandwidth > self.bound_s
        self.bounded += too_slow
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
        choices = [[(c, d.int_value()) for c, d in zip(self._output_classes[i], self._outputs[i].size_shape,
                                                       strict=True) if c != NO_CLASS] for i in missing]
        axes = {(frozenset(c for c, _ in pick), math.gcd(*(size for _, size in pick))) for pick in product(*choices)}
        return sorted(axes, key=lambda a: (sorted(a[0]), a[1]))

    def _reads_inputs(self, tensors: tuple[int, ...], rereads: bool | None) -> bool:
        """Does this choice of kernel inputs pass the `rereads` filter of `moves`?"""
        return rereads is None or (min(tensors) < len(self.program.inputs)) == rereads

    def _missing(self, s: KState) -> list[int]:
        """Program outputs no tensor of `s` matches yet."""
        return [
            i for i, node in enumerate(self._outputs)
            if not any(t.chunk is None and self._is_output(t.ae, t.shape, t.classes, i) for t in s.tensors)
        ]

    def _unused(self, s: KState) -> list[int]:
        """The kernel outputs that no kernel reads and no program output can be: a later kernel
        must read each, as a candidate reads or returns every tensor (`_candidate`; checked
        early, it saves whole searches of the last kernel over the program's raw inputs)."""
        read = {i for k in s.kernels for i in k.tensor_inputs}
        return [n for n, t in enumerate(s.tensors) if n >= len(self.program.inputs) and t.id not in read and not any(
            t.chunk is None and self._is_output(t.ae, t.shape, t.classes, i) for i in range(len(self._outputs)))]

    def _inputs_of(self, outputs: list[int]) -> set[str]:
        return set().union(*(self._target_leaves[i] for i in outputs))

    def _last_graph_floor(self, s: KState, spent: float, subset: tuple[int, ...], missing: list[int]) -> float:
        """The least time of `s` plus a last graph kernel over these tensors: `spent` plus
        `_whole_floor`, or when that kernel merges the chunks of a kernel of `s`, the two
        kernels' floors at the same chunk count (the merge's loop walks the chunks)."""
        floor = spent + self._whole_floor(s, subset, missing)
        if any(s.tensors[i].chunk is not None for i in subset):
            floor = max(floor, self._merged_later(s, lambda chunks: self._whole_floor(s, subset, missing, chunks)))
        return floor

    def _middle_floor(self, s: KState, later: int) -> Callable[[tuple[int, ...]], float]:
        """The least time of `s` plus a graph kernel over a subset of its tensors and `later`
        kernels after it, known before that kernel's block graphs are: `s`'s kernels, this
        kernel's least time (`_middle_own`), then each later one's launch and what they must move
        (`_owed`), or when one kernel follows, its least time (`_last_after`)."""
        spent = self._spent(s)
        rest = self.space.launches(later) * self.launch_s
        owed = self._owed(s)
        last = self._last_after(s) if later == 1 else None

        def floor(subset: tuple[int, ...]) -> float:
            after = rest + owed(subset) / self.bandwidth
            return spent + self._middle_own(s, subset) + (after if last is None else max(after, last(subset)))

        return floor

    def _last_after(self, s: KState) -> Callable[[tuple[int, ...]], float] | None:
        """The least time of the last kernel after `s` and a middle kernel over a subset of its
        tensors: it reads what that subset leaves unread (the program inputs the missing outputs
        need, the kernel outputs nothing reads: `_owed`) and, when one output is missing, an
        output of the middle kernel (which would otherwise not contribute: writing the output
        itself leaves the last kernel nothing to do). Then its inputs must let it compute that
        output (`_after_middle`); else, with more tensors to read than any library op takes, its
        floor is `_whole_floor` over them, and 0 when a library kernel may be last. None when any
        kernel may be a free view."""
        missing = self._missing(s)
        if self._free_kernels or not missing:
            return None
        arity = max((ops.OPS[op].arity for op in self.space.library_ops), default=0)
        unread, unused = self._left_to_read(s)
        middle_output = len(missing) == 1

        def floor(subset: tuple[int, ...]) -> float:
            must = tuple(sorted({i for i in (*unread, *unused) if i not in subset}))
            if middle_output and self._reach:
                return self._after_middle(s, must, self._reachable([s.tensors[i] for i in subset]), missing[0], arity)
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

    def _middle_own(self, s: KState, subset: tuple[int, ...]) -> float:
        """The least time of a graph kernel that reads these tensors of `s` and is not the last:
        its launch plus the larger of their bytes at full bandwidth and one loop iteration; when
        none is per-chunk partials, `costmodel.whole_reduction_floor` with its grid free to split
        any class of what it reads (it may write partial results) and nothing written: splitting
        a class re-reads every input without it, so a grid large enough to fill the DRAM pipe
        re-reads some input (attention's Q, K and Q K: 0.9 us more than their bytes on an H100)."""
        tensors = [s.tensors[i] for i in subset]
        own = self.launch_s + max(sum(map(self._bytes, tensors)) / self.bandwidth, self._iteration_s)
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
        read = tuple(sorted((self._bytes(t), frozenset(t.classes) - {NO_CLASS}) for t in tensors))
        key = (read, tuple(sorted(sizes.items())), tuple(sorted(owners.items())))
        hit = self._middle_owns.get(key)
        if hit is None:
            # Each class alone, and the classes that one tensor each has together (its outputs,
            # not known yet, may take them side by side: `tiling._side_by_side`; an axis over
            # some of them divides each one's size, so it divides their lcm), as often as
            # disjoint pairs of them can be axes.
            axes = [(frozenset({c}), size) for c, size in sizes.items()]
            group = frozenset(c for c in sizes if owners[c] == 1)
            axes += [(group, math.lcm(*(sizes[c] for c in group)))] * min(len(group) // 2, self.config.max_grid_axes)
            hit = self._middle_owns[key] = costmodel.whole_reduction_floor(
                self.target, read, 0.0, axes, self.config.max_grid_axes)
        return max(own, hit)

    def _owed(self, s: KState) -> Callable[[tuple[int, ...]], float]:
        """The fewest bytes the kernels after `s` must move, but for one reading a subset of its
        tensors: the missing outputs, the program inputs they read that no kernel reads yet, and
        the kernel outputs nothing reads yet; nothing when a later kernel may be free (a
        view of a computed tensor can be an output, or what an input or a kernel's output feeds)."""
        if self._free_kernels:
            return lambda subset: 0.0
        unread, unused = self._left_to_read(s)
        written = sum(self._output_bytes[i] for i in self._missing(s))

        def owed(subset: tuple[int, ...]) -> float:
            return written + sum(self._bytes(s.tensors[i]) for i in (*unread, *unused) if i not in subset)

        return owed

    def _left_to_read(self, s: KState) -> tuple[list[int], list[int]]:
        """What the kernels after `s` must read: the program inputs the missing outputs need that
        no kernel reads yet, and the kernel outputs nothing reads yet (`_unused`)."""
        read = {i for k in s.kernels for i in k.tensor_inputs}
        needed = self._inputs_of(self._missing(s))
        unread = [n for n, t in enumerate(s.tensors[:len(self.program.inputs)]) if t.id in needed and t.id not in read]
        return unread, self._unused(s)

    def _merged_later(self, s: KState, merge_s: Callable[[int], float]) -> float:
        """When one kernel of `s` writes per-chunk partials that no kernel reads yet, some later
        kernel merges them, its loop walking the chunks: the least time of the kernels of `s` with
        that merge's least time beyond its launch at each chunk count (`merge_s(chunks)`),
        minimized over the chunk count they share; without such a kernel, `_estimated`; 0 without
        a bound."""
        if self.bound_s == float("inf") or self.target is None:
            return 0.0
        others, pending = self._parts(s)
        if pending is None:
            return others
        return others + min((f + merge_s(c) for c, f in pending.items()), default=math.inf)

    def _completes_exactly(self, missing: list[int], outputs: Sequence[Sink]) -> bool:
        """Does a last kernel with these outputs (expression, shape, program dim classes) write
        every missing program output, and nothing else? (Any other output would be a tensor
        nothing reads.) Its dims must carry the output's classes, as `_whole_floor` assumes."""
        return len(outputs) <= len(missing) and all(
            any(shape == self._outputs[i].size_shape and _same_classes(pdims, self._output_classes[i])
                and self.oracle.equivalent(ae, i) for ae, shape, pdims in outputs)
            for i in missing
        )

    def _completes(self, missing: list[int], new: Sequence[tuple[AE, tuple[Size, ...], tuple[int, ...]]]) -> bool:
        return all(any(self._is_output(ae, shape, classes, i) for ae, shape, classes in new) for i in missing)

    def _is_output(self, ae: AE, shape: tuple[Size, ...], classes: tuple[int, ...], i: int) -> bool:
        """Does a tensor hold program output i: its expression, shape and dim classes? (A transpose
        keeps the expression, and a square one the shape; a reshape's dims have no class to compare.)"""
        wanted = self._output_classes[i]
        return shape == self._outputs[i].size_shape and all(
            RESHAPED in (p, c) or _same_classes((p,), (c,)) for p, c in zip(classes, wanted, strict=True)
        ) and self.oracle.equivalent(ae, i)

    def _library_moves(self, s: KState, final: bool, rereads: bool | None = None) -> Iterator[KState]:
        usable = [i for i, t in enumerate(s.tensors) if t.chunk is None]
        missing = self._missing(s) if final else []
        unused = self._unused(s) if final else []
        floor_s = self._last_kernel_floor(s) if final else 0.0
        for op in self.space.library_ops:
            arity = ops.OPS[op].arity
            for args in _tuples(usable, arity):
                if not set(unused) <= set(args) or not self._reads_inputs(args, rereads):
                    continue
                if final and op not in costmodel.FREE_OPS and self._too_slow(s, floor_s, args):
                    self.pruned += 1
                    continue
                for attrs in self._library_attrs.get(op, [{}]):
                    key = (max(args), args, 0, op, tuple(sorted((k, str(v)) for k, v in attrs.items())))
                    if key <= s.last_key:
                        continue
                    try:
                        shape = ops.infer_shape(op, [s.tensors[a].shape for a in args], attrs)
                    except ops.OpError:
                        continue
                    operands = [(s.tensors[a].ae, s.tensors[a].classes) for a in args]
                    ae, classes = apply(self._alg, op, operands, attrs, [])
                    if not self.oracle.contains(ae) or self._repeats(s, ae, shape, None, classes):
                        self.pruned += 1
                        continue
                    if final and not self._completes(missing, [(ae, shape, classes)]):
                        self.pruned += 1
                        continue
                    kid = f"k{len(s.kernels)}"
                    out = KTensor(f"t{len(s.kernels)}", shape, ae, classes)
                    kernel = LibraryKernel(kid, op, tuple(s.tensors[a].id for a in args), attrs, out.id)
                    yield KState((*s.tensors, out), (*s.kernels, kernel), key, s.graph_kernels)

    def _graph_moves(
        self, s: KState, final: bool, only: tuple[int, ...] | None = None, part: tuple[int, int] = (1, 0),
        rereads: bool | None = None, later: int = 0, program: Program | None = None,
    ) -> Iterator[KState]:
        """Graph kernels over every subset of the tensors (or `only` that one); `later` kernels to
        come after a kernel that is not the last bound it (`_middle_floor`). `program`: only the
        block graphs that compute this program (the whole one over its inputs, or a part of it
        over the tensors `only`, its inputs named by their ids: `program_split`)."""
        assert self._gen is not None
        indices = range(len(s.tensors))
        missing = self._missing(s) if final else []
        needed = self._inputs_of(missing) if final else set()
        unused = self._unused(s) if final else []
        spent = self._spent(s) if final else 0.0
        middle = None if final or not later or self.bound_s == float("inf") else self._middle_floor(s, later)
        for size in range(1, self.config.max_block_inputs + 1):
            for subset in combinations(indices, size):
                if (only is not None and subset != only) or not self._reads_inputs(subset, rereads):
                    continue
                if not set(unused) <= set(subset):
                    continue
                if final and not needed <= set().union(*(s.tensors[i].leaves for i in subset)):
                    continue  # the last kernel must see every program input its outputs read
                if final and self._last_graph_floor(s, spent, subset, missing) > self.bound_s:
                    self.pruned += 1
                    self.bounded += 1
                    continue
                if middle is not None and middle(subset) > self.bound_s:
                    self.pruned += 1
                    self.bounded += 1
                    continue
                chunks = {c.axis for i in subset if (c := s.tensors[i].chunk) is not None}
                if len(chunks) > 1:
                    continue
                tie = next(((c.axis, c.size) for i in subset if (c := s.tensors[i].chunk) is not None), None)
                specs = [self._spec(s.tensors[i], i, tie is not None) for i in subset]
                if self.config.concrete and tie is None:
                    yield from self._concrete_moves(s, subset, specs, final, missing)
                    continue
                blocks = self._blocks(specs, part) if program is None else self._program_blocks(s, specs, program)
                for block in blocks:
                    if final and not self._completes_exactly(missing, _sinks(block)):
                        self.pruned += 1
                        continue
                    kid = f"k{len(s.kernels)}"
                    ids = [t.id for t in s.tensors]
                    for res in resolve(block, specs, ids, kid, s.graph_kernels, tie, self._plans,
                                       self.config.max_grid_axes, partial_axes=not final):
                        signature = _signature(res.kernel)
                        key = (max(subset), subset, 1, signature)
                        if key <= s.last_key:
                            continue
                        new = []
                        for tid, tile, chunk in res.outputs:
                            shape = _output_shape(block, tile, chunk)
                            t = block.tiles[tile]
                            if self._repeats(s, t.ae, shape, chunk, t.pdims):
                                break
                            new.append(KTensor(tid, shape, t.ae, t.pdims, chunk))
                        else:
                            yield KState((*s.tensors, *new), (*s.kernels, res.kernel), key, s.graph_kernels + 1)
                            continue
                        self.pruned += 1

    def _concrete_moves(
        self, s: KState, subset: tuple[int, ...], specs: list[InputSpec], final: bool, missing: list[int],
    ) -> Iterator[KState]:
        """Mirage-style: fix the grid sizes, the maps and the loop range first, then generate block
        graphs over the concrete tiles, for every such choice (what the symbolic search avoids)."""
        kid = f"k{len(s.kernels)}"
        ids = [t.id for t in s.tensors]
        for axes, loop in concrete_tilings(specs):
            tiled = [InputSpec(sp.tensor, _tile(sp, axes, loop), sp.ae, sp.classes) for sp in specs]
            if any(d < 1 for sp in tiled for d in sp.shape):
                continue
            for block in self._blocks(tiled):
                res = resolve_fixed(block, tiled, ids, kid, s.graph_kernels, axes, loop)
                if res is None:
                    continue
                shapes = _kernel_shapes(self.program, s, res.kernel)
                new = [KTensor(tid, shapes[tid], block.tiles[tile].ae, block.tiles[tile].pdims, chunk)
                       for tid, tile, chunk in res.outputs]
                if any(self._repeats(s, t.ae, t.shape, t.chunk, t.classes) for t in new):
                    continue
                if final and not self._completes(missing, [(t.ae, t.shape, t.classes) for t in new if t.chunk is None]):
                    continue
                key = (max(subset), subset, 1, _signature(res.kernel))
                if key > s.last_key:
                    yield KState((*s.tensors, *new), (*s.kernels, res.kernel), key, s.graph_kernels + 1)

    def _spec(self, t: KTensor, index: int, tied: bool) -> InputSpec:
        if t.chunk is None:
            return InputSpec(index, tuple(d.int_value() for d in t.shape), t.ae, t.classes)
        shape = [d.int_value() if d.is_const() else 0 for d in t.shape]
        shape[t.chunk.dim] = t.chunk.base
        return InputSpec(index, tuple(shape), t.ae, t.classes, t.chunk.dim if tied else None)

    def _blocks(self, specs: Sequence[InputSpec], part: tuple[int, int] = (1, 0)) -> Iterator[BlockState]:
        """Complete block graphs over these inputs, smallest first. Generated lazily and memoized
        (the same inputs recur across kernel-level states): a later walk over the same inputs
        replays what was generated and continues from there. Kept for the most recently used
        combinations of inputs, within `BLOCK_CACHE_ENTRIES` and `BLOCK_CACHE_STATES`."""
        assert self._gen is not None
        key = (part, *((sp.shape, sp.ae, sp.classes, sp.tied_dim) for sp in specs))
        lazy = self.block_cache.pop(key, None)
        if lazy is None:
            lazy = Lazy[BlockState](self._gen.complete_graphs(self._gen.start(specs), part))
            # Room for it: the least recently used go, past so many combinations or block graphs.
            kept = sum(map(len, self.block_cache.values()))
            while self.block_cache and (len(self.block_cache) >= BLOCK_CACHE_ENTRIES or kept > BLOCK_CACHE_STATES):
                kept -= len(self.block_cache.pop(next(iter(self.block_cache))))
        self.block_cache[key] = lazy  # most recently used last
        for state in lazy:
            self._tick()
            yield state

    def _program_blocks(self, s: KState, specs: Sequence[InputSpec], program: Program) -> Iterator[BlockState]:
        """The block graphs computing `program` over the tensors of `s` that `specs` read (its
        inputs are named by their ids)."""
        assert self._gen is not None
        tiles = {s.tensors[sp.tensor].id: k for k, sp in enumerate(specs)}
        for state in self._gen.program_graphs(self._gen.start(specs), program, tiles):
            self._tick()
            yield state

    def _repeats(self, s: KState, ae: AE, shape: tuple[Size, ...], chunk: Chunk | None,
                 classes: tuple[int, ...]) -> bool:
        """Does a tensor of the state hold this value already? Same expression, shape, chunking
        and dim classes: a transpose keeps the expression (and a square one the shape) but not
        the classes."""
        return any(t.ae == ae and t.shape == shape and t.chunk == chunk and t.classes == classes for t in s.tensors)

    # -- candidates ------------------------------------------------------------------------------
    def _candidate(self, s: KState) -> SGraph | None:
        chosen: list[str] = []
        for i in range(len(self._outputs)):
            match = next(
                (t for t in reversed(s.tensors)
                 if t.chunk is None and t.id not in chosen and self._is_output(t.ae, t.shape, t.classes, i)),
                None,
            )
            if match is None or match.id in {n.id for n in self.program.inputs}:
                return None
            chosen.append(match.id)
        used = set(chosen).union(*(k.tensor_inputs for k in s.kernels))
        if any(t.id not in used for t in s.tensors):
            self.pruned += 1
            return None  # a tensor nothing reads: not a valid sGraph (checked here, before its analysis)
        needed = set(chosen)
        for k in reversed(s.kernels):
            if needed & set(k.outputs):
                needed |= set(k.tensor_inputs)
        if not all(set(k.outputs) & needed for k in s.kernels):
            return None
        decls = tuple(TensorDecl(n.id, n.shape, n.dtype or "f32") for n in self.program.inputs)
        try:
            sg = SGraph(decls, s.kernels, tuple(chosen), f"{self.program.name}.searched")
            sg.info  # noqa: B018 - validates
        except SGraphError:
            self.pruned += 1
            return None
        return sg


def _beats(a: FirstKernel, b: FirstKernel) -> bool:
    """Does a first kernel lead to a better graph than another computing the same tensors,
    whatever follows? At no chunk count is it slower, and it wins the ties: by its text (graphs
    that tie in time are ordered by their text, which differs first in the first kernel) or by
    being faster at every count (by more than float rounding of the sums)."""
    fa, fb = a.floors or {}, b.floors or {}
    if any(c not in fa or fa[c] > fb[c] for c in fb):
        return False
    return a.text < b.text or all(fa[c] * (1 + TIE) < fb[c] for c in fb)


def _leaves(e: AE) -> set[str]:
    if e[0] == "inp":
        return {e[1]}
    return set().union(*(_leaves(k) for k in e[1:] if isinstance(k, tuple))) if len(e) > 1 else set()


def _tuples(indices: Sequence[int], arity: int) -> Iterator[tuple[int, ...]]:
    if arity == 1:
        for i in indices:
            yield (i,)
    else:
        for i in indices:
            for j in indices:
                yield (i, j)


def _signature(k: GraphKernel) -> str:
    b = k.block
    parts = [f"{len(b.grid)}:{b.loop.size}"]
    parts += [f"i{i.tensor}{i.imap}{i.fmap}" for i in b.inputs]
    parts += [f"{o.op}{o.inputs}{sorted(o.attrs.items())}" for o in (*b.body, *b.post)]
    parts += [f"a{a.source}{a.kind}{a.dim}" for a in b.accumulators]
    parts += [f"o{o.source}{o.omap}" for o in b.outputs]
    return "|".join(parts)


GRID_TILES = (8, 16, 32, 64, 128, 256)  # Mirage's 1-D grid candidates: dim / tile for these tiles
LOOP_RANGES = (1, 4, 16, 64)  # Mirage's loop ranges, plus no loop


def concrete_tilings(specs: Sequence[InputSpec]) -> Iterator[tuple[list[tuple[int, int]], tuple[frozenset[int], int]]]:
    """Every concrete choice of grid axes (program dim class, size) and loop (classes, range) for
    these inputs, in a fixed order: 1 to 3 axes on distinct classes (in class order: permuted
    grids are the same schedule), each of a size n / tile for Mirage's tiles, and a loop over one
    or two classes (or none) whose range divides what it walks."""
    extent: dict[int, int] = {}
    for sp in specs:
        for size, c in zip(sp.shape, sp.classes, strict=True):
            if c != -1 and size > 1:
                extent[c] = size
    classes = sorted(extent)
    for n_axes in (1, 2, 3):
        for chosen in combinations(classes, n_axes):
            size_options = [[extent[c] // t for t in GRID_TILES if extent[c] % t == 0 and extent[c] > t] or [1]
                            for c in chosen]
            for sizes in _grid_product(size_options):
                axes = list(zip(chosen, sizes, strict=True))
                for n_loop in (0, 1, 2):
                    for walked in combinations(classes, n_loop):
                        for rng in LOOP_RANGES if walked else (1,):
                            if walked and rng == 1:
                                continue
                            left = {c: extent[c] // dict(axes).get(c, 1) for c in walked}
                            if all(left[c] % rng == 0 and left[c] > rng for c in walked):
                                yield axes, (frozenset(walked), rng)


def _grid_product(options: list[list[int]]) -> Iterator[tuple[int, ...]]:
    if not options:
        yield ()
        return
    for head in options[0]:
        for rest in _grid_product(options[1:]):
            yield (head, *rest)


def _tile(sp: InputSpec, axes: list[tuple[int, int]], loop: tuple[frozenset[int], int]) -> tuple[int, ...]:
    split = dict(axes)
    return tuple(
        size // split.get(c, 1) // (loop[1] if c in loop[0] else 1) if c != -1 else size
        for size, c in zip(sp.shape, sp.classes, strict=True)
    )


def _kernel_shapes(program: Program, s: KState, kernel: GraphKernel) -> dict[str, tuple[Size, ...]]:
    """Shapes of a new kernel's outputs, from the sGraph analysis of the state plus the kernel."""
    decls = tuple(TensorDecl(n.id, n.shape, n.dtype or "f32") for n in program.inputs)
    info = analyze(SGraph(decls, (*s.kernels, kernel), kernel.outputs, "partial"), require_used=False)
    return {t: info.shapes[t] for t in kernel.outputs}


def _sinks(block: BlockState) -> list[Sink]:
    """The abstract expression, full shape and program dim classes of each block output (its
    unconsumed post tiles)."""
    used = {a for t in block.tiles for a in t.args}
    return [(t.ae, _output_shape(block, k, None), t.pdims) for k, t in enumerate(block.tiles)
            if t.phase == 1 and k not in used]


def _block_counts(program: Program, max_grid: int) -> list[int]:
    """Every block count a graph kernel can have: products of at most `max_grid` grid axis sizes,
    each a divisor of a program dim (a split class; chunk dims are walked, never split)."""
    sizes = sorted({d for n in program.nodes.values() for size in n.shape for d in divisors(size)})
    counts = {1}
    for _ in range(max_grid):
        counts |= {c * d for c in counts for d in sizes}
    return sorted(counts)


def _same_classes(pdims: tuple[int, ...], classes: tuple[int, ...]) -> bool:
    """Do a tile's dims carry these program dim classes (size-1 dims have none to compare)?"""
    return all(c == NO_CLASS or p == c for p, c in zip(pdims, classes, strict=True))


def _output_shape(block: BlockState, tile: int, chunk: Chunk | None) -> tuple[Size, ...]:
    dims = block.tiles[tile].dims
    shape = [Size.const(1 if d < 0 else block.classes.size[block.classes.find(d)]) for d in dims]
    if chunk is not None:
        shape[chunk.dim] = Size.const(chunk.base) * chunk.size
    return tuple(shape)
