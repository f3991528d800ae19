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
with a graph-defined one (see `candidates_in`). States that cannot beat the best proved candidate
are cut by the floors of `search.floors` (`Floors`, the search's `floors`); a block space being
walked is cut as soon as the bound falls below its floor (`_walk`), a loop body's post-loop graphs
are not generated when its floor exceeds the bound (`_body_cut`), a middle kernel's block space
walked whole before is cut by its graphs' least floors (`Floors.space_floors`), and every cut is
counted by the floor that made it (`cuts`). No kernel writes, and no program split ends inside, an
elementwise chain (`search.space.Chain`: one block op).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import combinations
from typing import Any

from superopt import costmodel, ops
from superopt.config import (
    GRID_TILES,
    LOOP_RANGES,
    MAX_ACCUMULATORS,
    MAX_OUTPUTS,
    MIDDLES,
    SPLIT_ENDS,
    SPLIT_KEEP,
    SearchConfig,
)
from superopt.dimclasses import input_classes
from superopt.object_cache import BoundedDict, ObjectCache
from superopt.ops import Op
from superopt.program import Node, Program, Tensor
from superopt.search.block import BlockState, Body, Generator, InputSpec, Lazy
from superopt.search.floors import Floors, same_classes
from superopt.search.paths import ValuePaths
from superopt.search.space import Space, chain_runs
from superopt.search.states import FirstKernel, KState, KTensor
from superopt.search.stored import StoredValues
from superopt.search.tiling import PLAN_ENTRIES, Chunk, Plans, Sink, output_shape, resolve, resolve_fixed, sinks
from superopt.search.views import ProgramViews
from superopt.sgraph import GraphKernel, Kernel, LibraryKernel, SGraph, SGraphError, analyze, input_decls
from superopt.sizes import Size
from superopt.targets import Target
from superopt.verifier.oracle import AE, Oracle

# ("library", move key) | ("graph" | "program", input tensor indices); the driver's own shards:
# ("split" | "settle" | "baseline", None)
FirstChoice = tuple[str, Any]
BLOCK_CACHE_ENTRIES = 256  # input combinations whose block graphs are kept (least recently used go)
BLOCK_CACHE_STATES = 100_000  # block graphs kept in all (beyond those of the combination being generated)


class BudgetExhausted(Exception):
    """The search ran out of time or states (the caller keeps the best found so far)."""


class Bounded(Exception):
    """No block graph of the walk under way can beat the bound any more (`KernelSearch._walk`)."""


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
    # Block spaces by their inputs: the least recently used go past so many combinations or block graphs.
    block_cache: BoundedDict[tuple[Any, ...], Lazy[tuple[BlockState, Lazy[BlockState]]]] = field(
        init=False, default_factory=lambda: BoundedDict(BLOCK_CACHE_ENTRIES, _cached_graphs, BLOCK_CACHE_STATES))
    on_state: Callable[[KernelSearch], None] | None = None
    target: Target | None = None  # the bound's cost model (None: no bound)
    views: ProgramViews | None = None  # the views the searched program leaves out (estimates read them as stored)
    # Another search's value paths, of the same program and oracle (a probe's: `Driver.probe`):
    # they depend on neither the block size nor the bound, and their memos are the costly part.
    paths: ValuePaths | None = None
    # Branch and bound: graphs that must take longer than `bound_s` on `target` are not built.
    # Kernels already chosen take at least the cost model's best time for them alone; every
    # kernel to come costs a launch plus the bytes of the tensors it reads and writes at full
    # bandwidth (the cost model never charges less).
    floors: Floors = field(init=False)
    _gen: Generator = field(init=False)

    def __post_init__(self) -> None:
        self._first_kernels: dict[tuple[FirstChoice, tuple[int, int]], list[FirstKernel]] = {}  # see first_kernels
        self._plans: Plans = ObjectCache(PLAN_ENTRIES)  # block graph -> its tilings (see `resolve`)
        # While a block space is walked: whether the bound now cuts all of it (see `_walk`).
        self._walk_cut: Callable[[], bool] | None = None
        self._alg = self.oracle.alg
        self.floors = Floors(self.program, self.space, self.oracle, self.config, self.target, self.views, self.paths)
        # A reshape of the value a program reshape reads, in the same layout, to the same shape:
        # its dims get the program's classes (`abstract_program`), which the algebra cannot know.
        # The only reshapes searched: the abstract values do not tell a reshape apart, and no
        # prover rule moves one, so a schedule reshaping any other value is never proved.
        self._reshapes = {(self.oracle.class_of(self.floors.values[n.inputs[0]][0]), self.floors.values[n.inputs[0]][1],
                           n.size_shape): self.floors.values[n.id][1]
                          for n in self.program.topological() if n.op == Op.RESHAPE}
        # Tensor cores read a block matmul's operands in the program's dtype, as kernels store
        # tensors between them: values computed in the kernel that it reads follow the same rule.
        self._gen = Generator(self.space, self.oracle, self.config.max_block_ops, on_state=self._tick,
                              no_loop_tilings=not self.config.concrete,
                              max_outputs=max(MAX_OUTPUTS, len(self.program.outputs)), staged=self.floors.stored)
        # The e-classes that rule reads cannot tell some values apart: a candidate's numbers can.
        self._stored_values = None if self.floors.stored is None else StoredValues.of(self.program)
        runs = chain_runs(self.program)
        self._run_of = {n.id: k for k, run in enumerate(runs) for n in run}  # program node -> its chain
        self._inner_nodes = {n.id for run in runs for n in run[:-1]}
        self._library_attrs: dict[str, list[dict[str, Any]]] = {}
        for n in self.program.topological():
            if n.op in ("input", Op.CONST):
                continue
            entry = self._library_attrs.setdefault(n.op, [])
            if dict(n.attrs) not in entry:
                entry.append(dict(n.attrs))

    def forget(self) -> None:
        """Break the reference cycles that keep a finished search alive (`Generator.forget`, the
        lazily generated block graphs, the progress callback)."""
        self._gen.forget()
        self.block_cache.clear()
        self.on_state = None

    # -- budget ----------------------------------------------------------------------------------
    @property
    def total_states(self) -> int:
        return self.states + self._gen.states

    @property
    def total_pruned(self) -> int:
        return self.pruned + self._gen.pruned + self.floors.pruned

    def _tick(self) -> None:
        if self.on_state is not None:
            self.on_state(self)
        self._within_deadline()
        if self.max_states is not None and self.total_states >= self.max_states:
            raise BudgetExhausted("states")
        if self._walk_cut is not None and self._walk_cut():
            raise Bounded

    def _walk(self, blocks: Iterator[BlockState], cut: Callable[[], bool], ended: list[bool]) -> Iterator[BlockState]:
        """The block graphs of `blocks` until `cut` says that none of them can beat the bound: asked
        at every state of their generation, not only before it, for the bound tightens while a
        block space is walked (a candidate proved by it, or by the probe the walk ran), and a
        one-kernel walk asked only before it would go on long after the probe had proved a time
        no one kernel reaches. `ended` is set when the walk was cut."""
        it = iter(blocks)
        while True:
            outer, self._walk_cut = self._walk_cut, cut
            try:
                block = next(it)
            except StopIteration:
                return
            except Bounded:
                self.floors.cut("block walk")
                ended.append(True)
                return
            finally:
                self._walk_cut = outer
            yield block

    def _walk_floor(self, floor: Callable[[], float]) -> Callable[[], bool]:
        """`_walk`'s test: the bound is below `floor` (the least time of any graph the walk leads
        to), computed once the bound is known."""
        known: list[float] = []

        def cut() -> bool:
            if self.floors.bound_s == float("inf"):
                return False
            if not known:
                known.append(floor())
            return known[0] > self.floors.bound_s

        return cut

    def _within_deadline(self) -> None:
        """Past the deadline, stop. Asked at every new state, and between first kernels being
        ranked, which makes none and can take long past the budget for a large program."""
        if time.time() > self.deadline:
            raise BudgetExhausted("time")

    # -- the walk ------------------------------------------------------------------------------
    def initial(self) -> KState:
        classes = input_classes(self.program)
        tensors = tuple(KTensor(n.id, n.size_shape, ("inp", n.id), classes[n.id]) for n in self.program.inputs)
        return KState(tensors, (), ())

    def candidates(self) -> Iterator[SGraph]:
        """Every candidate sGraph, fewest kernels first (iterative deepening over the kernel count:
        one-kernel answers come before any deeper branch is explored; the driver's shards walk the
        same choices, with its bound)."""
        for depth in range(1, self.config.max_kernel_ops + 1):
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
        needed = self.floors.inputs_of(self.floors.missing(root)) if final else set()
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
        return self._gen.body_part(self._first_start(choice), part)

    def adopt_bodies(self, choice: FirstChoice, bodies: Sequence[Body], part: tuple[int, int]) -> None:
        """Use these loop bodies (all parts of `body_part`) for a part of the choice's first kernel."""
        self._gen.adopt_bodies(self._first_start(choice), bodies, part)

    def _first_start(self, choice: FirstChoice) -> BlockState:
        assert choice[0] == "graph"
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
        if choice[0] == "graph" and not final and self._first_too_slow(choice[1], depth, part):
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
        # With a graph middle kernel, both passes are made per first kernel: their middle block
        # spaces (qknorm_gqa: some 25,000 block graphs per first kernel, 65 first kernels over Q)
        # are kept for the second pass only while they are the last few (`BLOCK_CACHE_STATES`).
        second = part if choice[0] == "library" and firsts is None else (1, 0)  # graph ones were split already
        for kind in MIDDLES if depth >= 3 and middle is None else (middle,):
            passes = [(s, r) for s in states for r in (False, True)] if kind == "graph" else \
                [(s, r) for r in (False, True) for s in states]
            for state, rereads in passes:
                yield from self._at_depth(state, depth, rereads, second, kind)

    def _first_too_slow(self, subset: tuple[int, ...], depth: int, part: tuple[int, int]) -> bool:
        """Must every graph of `depth` kernels whose first is a graph kernel over these inputs
        exceed the bound (`Floors.middle_floor` of that kernel, `depth - 1` kernels after it)? Asked
        before its first kernels are generated and ranked (a large block space each: rmsnorm_mlp's
        first kernels over X and one weight are cut by this alone)."""
        floors = self.floors
        if floors.bound_s == float("inf") or \
                floors.middle_floor(self.initial(), depth - 1, part)(subset) <= floors.bound_s:
            return False
        floors.cut("first kernel's inputs")
        return True

    def first_kernels(self, choice: FirstChoice, part: tuple[int, int] = (1, 0)) -> list[FirstKernel]:
        """A graph choice's first kernels for deeper graphs (not the last kernel), from this part of
        its block graphs, without those that `keep` others beat (`undominated`); kept, as deeper
        graphs start the same way. The driver gathers every part's, cuts those beaten across parts
        (`undominated`) and deals them out to the shards of deeper graphs."""
        key = (choice, part)
        if key not in self._first_kernels:
            ranked = []
            for st in self._graph_moves(self.initial(), False, only=choice[1], part=part, first=True):
                self._within_deadline()
                if (first := self.floors.ranked_first(st)) is not None:
                    ranked.append(first)
            self._first_kernels[key] = self.floors.undominated(ranked)
        return self._first_kernels[key]

    def program_split(self, whole: bool = False) -> list[SGraph]:
        """Schedules of a program too large for one kernel, cut into consecutive parts that each
        fit one (`_split`), in the listed order and the library ops' (`_split_orders`), each
        giving its schedules. A fused schedule at once, and a bound, where the one-kernel search
        may outlast any budget (a 12-op chain over two inputs) or cannot hold the program (heads
        split by a reshape in the middle: the search reaches 3 kernels late). Empty when the
        program fits one block graph by its op and input counts (`fits_one_part`: the search
        starts with it) unless `whole` (the driver's probe, once the one-kernel search is large:
        a gated MLP with its residual, whose weights no one block holds whole, has no one-kernel
        schedule of valid sizes), or no order can be cut."""
        orders = self._split_orders()
        if not orders[0] or (self.fits_one_part() and not whole):
            return []
        found: dict[str, SGraph] = {}
        for order in orders:
            for sg in (self._candidate(st) for st in self._split(order)[1]):
                if sg is not None:
                    found.setdefault(sg.dumps(), sg)
        return list(found.values())

    def fits_one_part(self) -> bool:
        """The whole program is one part of `_split` by its op and input counts."""
        listed = self._split_orders()[0]
        return bool(listed) and self._part_ends(listed, 0)[:1] == [len(listed)]

    def _split(self, ops_: list[Node]) -> tuple[list[list[Node]], list[KState]]:
        """The ops (in a dependency order) cut into consecutive parts, and the `SPLIT_KEEP`
        cheapest schedules (`_split_cost`) of those cuts with the parts of the program's best one:
        every part one graph kernel computing it as `Generator.program_graphs` does the whole
        program, or one library kernel for an op no block graph has (a reshape, a transpose).
        From each point, the `SPLIT_ENDS` longest parts (`_part_ends`) some kernel of which has
        valid sizes at the program's shapes are tried, and the cheapest schedules reaching each
        point go on: a decoder layer's gated MLP with its residual add needs every weight whole in
        one block; cut before the add, every block of rows reads all three weights, over twice the
        time of a cut before the down projection. ([], []) when no cut reaches the end."""
        reached: dict[int, list[tuple[KState, tuple[list[Node], ...]]]] = {0: [(self.initial(), ())]}
        for start in range(len(ops_)):
            here = self._cheapest(reached.pop(start, []))
            ends = 0
            for end in self._part_ends(ops_, start) if here else []:
                nodes = ops_[start:end]
                grown = [(nxt, (*parts, nodes)) for st, parts in here for nxt in self._part_moves(st, nodes)]
                if self.target is not None:
                    grown = [e for e in grown if self.floors.estimated(e[0]) < math.inf]  # valid sizes
                if grown:
                    reached.setdefault(end, []).extend(grown)
                    ends += 1
                    if ends == SPLIT_ENDS:
                        break
        done = self._cheapest(reached.get(len(ops_), []))
        return (list(done[0][1]) if done else []), [st for st, _ in done]

    def _cheapest(self, reached: list[tuple[KState, Any]]) -> list[tuple[KState, Any]]:
        """The `SPLIT_KEEP` cheapest partial schedules (`_split_cost`), each once (two cuts may
        build the same kernels)."""
        distinct = {repr(e[0].kernels): e for e in reversed(reached)}  # the first of equal ones
        return sorted(reversed(distinct.values()), key=lambda e: self._split_cost(e[0]))[:SPLIT_KEEP]

    def _split_orders(self) -> list[list[Node]]:
        """The program's ops as it lists them, and (when different) with each library op as early
        as its operands allow: ordered by the number of library ops on the longest path to them,
        the library ops of a level before its block ops. Block ops no library op separates then
        fall into one run: the Q, K and V projections of one X before the heads are split, one
        kernel side by side, where the listed order cuts a reshape between each two."""
        ops_ = [n for n in self.program.topological() if n.op not in ("input", Op.CONST)]
        level: dict[str, int] = {}
        for n in ops_:
            level[n.id] = max((level.get(i, 0) for i in n.inputs), default=0) + (n.op not in self.space.block_ops)
        index = {n.id: k for k, n in enumerate(ops_)}
        leveled = sorted(ops_, key=lambda n: (level[n.id], n.op in self.space.block_ops, index[n.id]))
        return [ops_] if leveled == ops_ else [ops_, leveled]

    def _split_cost(self, s: KState) -> float:
        """The least time of a partial split schedule: its launches and bytes, or (with a target)
        the cost model's least estimate of its kernels, which also sees a block re-reading whole
        weights (`Floors.spent` has it only once the search has a bound)."""
        return self.floors.spent(s) if self.target is None else max(self.floors.spent(s), self.floors.estimated(s))

    def _part_ends(self, ops_: list[Node], start: int) -> list[int]:
        """Where a part of the ops from `start` may end, longest first: an op no block graph has
        alone; else runs of at most `max_block_ops` block ops, at most `max_block_inputs` tensors
        read from outside and at most `MAX_ACCUMULATORS` values read after them (or returned),
        each of which nothing in its own run reads unless the program returns it (a block graph
        writes its sinks, its accumulators)."""
        if ops_[start].op not in self.space.block_ops:
            return [start + 1]
        stop = next((k for k in range(start, len(ops_)) if ops_[k].op not in self.space.block_ops), len(ops_))
        return [e for e in range(stop, start, -1) if self._block_steps(ops_[start:e]) <= self.config.max_block_ops
                and not self._cuts_chain(ops_, e) and self._one_part(ops_[start:e], ops_[e:])]

    def _block_steps(self, nodes: list[Node]) -> int:
        """The block ops these program nodes take: a chain (`Chain`) is one."""
        return sum(1 for n in nodes if n.id not in self._inner_nodes)

    def _cuts_chain(self, ops_: list[Node], end: int) -> bool:
        """Would a part ending here cut a chain (its ops on both sides)? No block graph can write
        a chain's inner value."""
        return bool({self._run_of.get(n.id) for n in ops_[:end]} & {self._run_of.get(n.id) for n in ops_[end:]}
                    - {None})

    def _one_part(self, nodes: list[Node], after: list[Node]) -> bool:
        ids = {n.id for n in nodes}
        outside = {i for n in nodes for i in n.inputs if i not in ids and self.program.nodes[i].op != Op.CONST}
        read_later = {i for n in after for i in n.inputs} | set(self.program.outputs)
        outputs = [n for n in nodes if n.id in read_later]
        read_here = {i for n in nodes for i in n.inputs}
        return (len(outside) <= self.config.max_block_inputs and 1 <= len(outputs) <= MAX_ACCUMULATORS
                and not any(n.id in read_here and n.id not in self.program.outputs for n in outputs))

    def _part_moves(self, s: KState, nodes: list[Node]) -> Iterator[KState]:
        """`s` and one kernel computing these program nodes from the tensors of `s` that hold
        their operands (as `_split` cuts them): a graph kernel, or the library kernel of a part of
        one op without constant operands (the only kernel of an op no block graph has; for a
        product whose left operand has few rows, the library's is faster than any block graph)."""
        ids = {n.id for n in nodes}
        held: dict[str, int] = {}
        for i in (i for n in nodes for i in n.inputs if i not in ids and self.program.nodes[i].op != Op.CONST):
            if i not in held:
                # another tensor than the operands' so far where one is: a square value and its
                # transpose may agree in shape, value and dim classes
                matches = self._holding(s, i)
                match = next((k for k in matches if k not in held.values()), next(iter(matches), None))
                if match is None:
                    return
                held[i] = match
        # No canonical order between parts: this kernel may read older tensors than the last one.
        unordered = KState(s.tensors, s.kernels, (), s.graph_kernels)
        n = nodes[0]
        if len(nodes) == 1 and len(held) == len(set(n.inputs)):  # one op, no constant operand
            args = tuple(s.tensors[held[i]].id for i in n.inputs)
            moves = self._library_moves(unordered, False, only=(n.op, tuple(held[i] for i in n.inputs)))
            yield from (nxt for nxt in moves if isinstance(k := nxt.kernels[-1], LibraryKernel)
                        and (k.op, k.inputs, k.attrs) == (n.op, args, dict(n.attrs)))
        if n.op not in self.space.block_ops or any(not self.program.nodes[i].shape for i in held):
            return  # (a 0-d tensor is no program input: a part cannot read one)
        part = Program(f"{self.program.name}.part")
        name = {i: s.tensors[k].id for i, k in held.items()}  # inputs: the tensors' ids; ops: the builder's
        for i in sorted({k: i for i, k in held.items()}.values(), key=held.__getitem__):  # a tensor once
            node = self.program.nodes[i]
            part.input(name[i], node.shape, node.dtype or "f32")
        for n in nodes:
            operands = [float(self.program.nodes[i].attrs["value"]) if self.program.nodes[i].op == Op.CONST
                        else Tensor(part, name[i]) for i in n.inputs]
            name[n.id] = part.op(n.op, *operands, **dict(n.attrs)).id
        read_later = {i for m in self.program.topological() if m.id not in ids for i in m.inputs}
        kept = [n.id for n in nodes if n.id in read_later or n.id in self.program.outputs]
        part.outputs = [name[i] for i in kept]
        subset = tuple(sorted(set(held.values())))
        for nxt in self._graph_moves(unordered, False, only=subset, program=part):
            # every value the part must keep written (a kernel may write others of the same class)
            if all(t.chunk is None for t in nxt.tensors[len(s.tensors):]) \
                    and all(max(self._holding(nxt, i), default=-1) >= len(s.tensors) for i in kept):
                yield nxt

    def _holding(self, s: KState, node: str) -> list[int]:
        """The tensors of `s` holding a program node's value as the program lays it out: its shape,
        its value's class and its dims' classes."""
        (ae, classes), shape = self.floors.values[node], self.program.nodes[node].size_shape
        cls = self.oracle.class_of(ae)
        return [] if cls is None else [
            k for k, t in enumerate(s.tensors) if t.chunk is None and t.shape == shape
            and same_classes(t.classes, classes) and self.oracle.class_of(t.ae) == cls]

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
        floors = self.floors
        if left and floors.bound_s < float("inf"):
            # The kernels so far, the launches to come and what they must move take too long?
            # Asked first of what is known without analyzing a new kernel (`Floors.known_spent`).
            launches = self.space.launches(left) * floors.launch_s
            owed = floors.owed(state)(()) / floors.bandwidth
            if launches + owed + floors.known_spent(state) > floors.bound_s or launches + max(
                    floors.spent(state) + owed,
                    floors.merged_later(state, lambda chunks: chunks * floors.iteration_s)) > floors.bound_s:
                floors.cut("kernels so far")
                return
            if floors.paths_floor(state, left) > floors.bound_s:
                floors.cut("value paths")
                return
        if len(state.kernels) == depth:
            cand = self._candidate(state)
            if cand is not None:
                yield cand
            return
        if state.kernels and not self.floors.missing(state):
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
        # A kernel right before the last makes no dim class the outputs lack, unless a reshape.
        lacking = not final and later == 1 and self.floors.lacks_classes(s)
        if part[1] == 0 and kind != "graph":
            yield from (m for m in self._library_moves(s, final, rereads)
                        if not lacking or _reshapes(m.kernels[-1]))
        if kind != "library" and not lacking:
            yield from self._graph_moves(s, final, part=part, rereads=rereads, later=later)

    def _reads_inputs(self, tensors: tuple[int, ...], rereads: bool | None) -> bool:
        """Does this choice of kernel inputs pass the `rereads` filter of `moves`?"""
        return rereads is None or (min(tensors) < len(self.program.inputs)) == rereads

    def _completes_exactly(self, missing: list[int], outputs: Sequence[Sink]) -> bool:
        """Does a last kernel with these outputs (expression, shape, program dim classes) write
        every missing program output, and nothing else? (Any other output would be a tensor
        nothing reads.) Its dims must carry the output's classes, as `_whole_floor` assumes."""
        return len(outputs) <= len(missing) and all(
            any(shape == self.floors.outputs[i].size_shape and same_classes(pdims, self.floors.output_classes[i])
                and self.oracle.equivalent(ae, i) for ae, shape, pdims in outputs)
            for i in missing
        )

    def _completes(self, missing: list[int], new: Sequence[tuple[AE, tuple[Size, ...], tuple[int, ...]]]) -> bool:
        return all(any(self.floors.is_output(ae, shape, classes, i) for ae, shape, classes in new) for i in missing)

    def _library_moves(
        self, s: KState, final: bool, rereads: bool | None = None, only: tuple[str, tuple[int, ...]] | None = None,
    ) -> Iterator[KState]:
        """Library kernels on the tensors of `s` (`only`: that op on those tensors)."""
        usable = [i for i, t in enumerate(s.tensors) if t.chunk is None]
        missing = self.floors.missing(s) if final else []
        unused = self.floors.unused(s) if final else []
        floor_s = self.floors.last_kernel_floor(s) if final else 0.0
        for op in self.space.library_ops if only is None else [o for o in self.space.library_ops if o == only[0]]:
            arity = ops.OPS[op].arity
            for args in _tuples(usable, arity) if only is None else [only[1]]:
                if not set(unused) <= set(args) or not self._reads_inputs(args, rereads):
                    continue
                if final and op not in costmodel.FREE_OPS and self.floors.too_slow(s, floor_s, args):
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
                    ae, classes = self._alg.apply(op, operands, attrs, [])
                    if op == Op.RESHAPE:
                        reshaped = self._reshapes.get((self.oracle.class_of(ae), operands[0][1], shape))
                        if reshaped is None:
                            self.pruned += 1
                            continue  # no prover rule moves a reshape: one of another value is never proved
                        classes = reshaped
                    if not self.oracle.contains(ae) or self._gen.inner(ae) or \
                            self._repeats(s, ae, shape, None, classes) or self._overflows(ae, None):
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
        rereads: bool | None = None, later: int = 0, program: Program | None = None, first: bool = False,
    ) -> Iterator[KState]:
        """Graph kernels over every subset of the tensors (or `only` that one); `later` kernels to
        come after a kernel that is not the last bound it (`Floors.middle_floor`), or for a `first`
        kernel of graphs of any depth, what must follow it at any depth (a launch, the bytes the
        later kernels must move: as `Floors.ranked_first`). `program`: only the
        block graphs that compute this program (the whole one over its inputs, or a part of it
        over the tensors `only`, its inputs named by their ids: `program_split`)."""
        indices = range(len(s.tensors))
        missing = self.floors.missing(s) if final else []
        needed = self.floors.inputs_of(missing) if final else set()
        spans = self.floors.classes_of(missing) if final else set()
        if not spans <= set().union(*(t.classes for t in s.tensors)):
            return  # no subset of the tensors has every class the outputs have (block ops make none)
        unused = self.floors.unused(s) if final else []
        spent = self.floors.spent(s) if final else 0.0
        middle = None if final or not (later or first) or self.floors.bound_s == float("inf") else \
            self.floors.middle_floor(s, max(later, 1), part, then_last=not first)
        writable_of = None if middle is None else self.floors.writable(s, max(later, 1), then_last=not first)
        for size in range(1, self.config.max_block_inputs + 1):
            for subset in combinations(indices, size):
                if (only is not None and subset != only) or not self._reads_inputs(subset, rereads):
                    continue
                if not set(unused) <= set(subset):
                    continue
                if final and not needed <= set().union(*(s.tensors[i].leaves for i in subset)):
                    continue  # the last kernel must see every program input its outputs read
                if final and not spans <= set().union(*(s.tensors[i].classes for i in subset)):
                    continue  # and a dim of each class its outputs have (block ops make no dims)
                if final and self.floors.last_graph_floor(s, spent, subset, missing) > self.floors.bound_s:
                    self.floors.cut("last kernel's inputs")
                    continue
                if middle is not None and middle(subset) > self.floors.bound_s:
                    self.floors.cut("middle kernel's inputs")
                    continue
                chunks = {c.axis for i in subset if (c := s.tensors[i].chunk) is not None}
                if len(chunks) > 1:
                    continue
                tie = next(((c.axis, c.size) for i in subset if (c := s.tensors[i].chunk) is not None), None)
                specs = [self._spec(s.tensors[i], i, tie is not None) for i in subset]
                if self.config.concrete and tie is None:
                    yield from self._concrete_moves(s, subset, specs, final, missing, program)
                    continue
                # Middle kernels over program inputs only are the same after every earlier kernel:
                # the second time they are generated, their least time is kept (`Floors.middle_floor`).
                walk = None if middle is None or first else self.floors.middle_key(s, subset, part)
                walks = 0 if walk is None else self.floors.middle_walks.get(walk, 0)
                least = math.inf if walk is not None and walks == 1 and self.target is not None else None
                # A middle kernel's block space walked whole before (after another earlier kernel
                # computing the same tensors) is bounded by its graphs' least floors (`Floors.space_floors`).
                bounding = middle if tie is None and program is None else None
                space = None if bounding is None else _space_key(specs, part)
                if bounding is not None and (known := self.floors.space_floors.get(space)) is not None \
                        and bounding(subset, *known) > self.floors.bound_s:
                    self.floors.cut("middle block space")
                    continue
                lowest = (math.inf, math.inf)  # the least (own, written) of the walk's block graphs
                skipped: list[float] = []  # the floors of the loop bodies cut (`_body_cut`)
                # what this kernel may write: the sets of program values that leave a path within the bound
                writable = None if writable_of is None else writable_of(subset)
                body_cut = None if bounding is None else self._body_cut(s, subset, bounding, skipped, writable)
                blocks = self._blocks(specs, part, body_cut) if program is None else \
                    self._program_blocks(s, specs, program)
                ended: list[bool] = []
                cut = self._walk_floor(self._subset_floor(s, subset, final, later, first, part))
                for block in self._walk(blocks, cut, ended):
                    if final and not self._completes_exactly(missing, sinks(block)):
                        self.pruned += 1
                        continue
                    if middle is not None and tie is None:
                        tiled = self.floors.tiled_floor(s, subset, block)
                        lowest = (min(lowest[0], tiled[0]), min(lowest[1], tiled[1])) if tiled else (0.0, 0.0)
                        cut_by = None if not tiled else "middle block graph" \
                            if middle(subset, *tiled) > self.floors.bound_s else "value paths' writes" \
                            if writable is not None and self.floors.writes_none_of(block, writable) else None
                        if tiled and cut_by is not None:
                            if least is not None:  # its kernels take at least its own floor
                                least = min(least, tiled[0])
                            self.floors.cut(cut_by)
                            continue
                    kid = f"k{len(s.kernels)}"
                    ids = [t.id for t in s.tensors]
                    for res in resolve(block, specs, ids, kid, s.graph_kernels, tie, self._plans,
                                       self.config.max_grid_axes, partial_axes=not final):
                        outputs = [KTensor(tid, output_shape(block, tile, chunk), block.tiles[tile].ae,
                                           block.tiles[tile].pdims, chunk) for tid, tile, chunk in res.outputs]
                        if least is not None:
                            least = min(least, self.floors.least_alone(s, res.kernel, outputs))
                        key = (max(subset), subset, 1, _signature(res.kernel))
                        if key <= s.last_key:
                            continue
                        if any(self._repeats(s, t.ae, t.shape, t.chunk, t.classes) or self._overflows(t.ae, t.chunk)
                               for t in outputs):
                            self.pruned += 1
                            continue
                        yield KState((*s.tensors, *outputs), (*s.kernels, res.kernel), key, s.graph_kernels + 1)
                if skipped:  # the block graphs of a body cut take at least its floor, and may write nothing
                    least = None if least is None else min(least, *skipped)
                    lowest = (min(lowest[0], *skipped), 0.0)
                if walk is not None and not ended:  # a walk cut short knows no least time
                    self.floors.middle_walks[walk] = walks + 1
                    if least is not None:
                        self.floors.middle_least[walk] = least
                if space is not None and not ended:
                    self.floors.space_floors[space] = lowest

    def _body_cut(self, s: KState, subset: tuple[int, ...], middle: Callable[..., float], skipped: list[float],
                  writable: tuple[int, ...] | None) -> Callable[[BlockState], bool]:
        """Does no block graph completing a loop body beat the bound: none writes values that leave
        a path within it (`writable`, `Floors.writes_none_from`), or by `Floors.body_floor` in
        `middle` (the `Floors.middle_floor` of this kernel)? Counted as a cut of the bound, its
        floor noted in `skipped` (what the walk learns of its kernels must cover theirs: for the
        former, the floor of any kernel over these tensors)."""
        any_kernel: list[float] = []  # the floor of any kernel over these tensors, once needed

        def cut(body: BlockState) -> bool:
            if self.floors.bound_s == float("inf"):
                return False
            if writable is not None and self.floors.writes_none_from(body, writable):
                self.floors.cut("value paths' writes")
                if not any_kernel:
                    any_kernel.append(self.floors.middle_own(s, subset))
                    skipped.append(any_kernel[0])  # (`skipped` is read for its least)
                return True
            own = self.floors.body_floor(s, subset, body)
            if middle(subset, own) <= self.floors.bound_s:
                return False
            self.floors.cut("middle loop body")
            skipped.append(own)
            return True

        return cut

    def _subset_floor(self, s: KState, subset: tuple[int, ...], final: bool, later: int, first: bool,
                      part: tuple[int, int]) -> Callable[[], float]:
        """The least time of any graph through a kernel of `s` over these tensors, as `_graph_moves`
        bounds it before its block graphs: a last kernel's (`Floors.last_graph_floor`), or a middle or
        first one's (`Floors.middle_floor`); 0 for the others."""
        if final:
            return lambda: self.floors.last_graph_floor(s, self.floors.spent(s), subset, self.floors.missing(s))
        if later or first:
            return lambda: self.floors.middle_floor(s, max(later, 1), part, then_last=not first)(subset)
        return lambda: 0.0

    def _concrete_moves(
        self, s: KState, subset: tuple[int, ...], specs: list[InputSpec], final: bool, missing: list[int],
        program: Program | None = None,
    ) -> Iterator[KState]:
        """Mirage-style: fix the grid sizes, the maps and the loop range first, then generate block
        graphs over the concrete tiles, for every such choice (what the symbolic search avoids);
        `program`: only the block graphs computing it (as `_graph_moves`)."""
        kid = f"k{len(s.kernels)}"
        ids = [t.id for t in s.tensors]
        for axes, loop in concrete_tilings(specs, self.config.max_grid_axes):
            tiled = [InputSpec(sp.tensor, _tile(sp, axes, loop), sp.ae, sp.classes) for sp in specs]
            if any(d < 1 for sp in tiled for d in sp.shape):
                continue
            for block in self._blocks(tiled) if program is None else self._program_blocks(s, tiled, program):
                res = resolve_fixed(block, tiled, ids, kid, s.graph_kernels, axes, loop)
                if res is None:
                    continue
                shapes = _kernel_shapes(self.program, s, res.kernel)
                new = [KTensor(tid, shapes[tid], block.tiles[tile].ae, block.tiles[tile].pdims, chunk)
                       for tid, tile, chunk in res.outputs]
                if any(self._repeats(s, t.ae, t.shape, t.chunk, t.classes) or self._overflows(t.ae, t.chunk)
                       for t in new):
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

    def _blocks(self, specs: Sequence[InputSpec], part: tuple[int, int] = (1, 0),
                cut: Callable[[BlockState], bool] | None = None) -> Iterator[BlockState]:
        """Complete block graphs over these inputs, smallest first, but those completing a loop body
        that `cut` refuses (their post-loop graphs are then not generated). Generated lazily and
        memoized (the same inputs recur across kernel-level states, whose bounds differ): a later
        walk over the same inputs replays what was generated and continues from there. Kept for
        the most recently used combinations of inputs, within `BLOCK_CACHE_ENTRIES` and
        `BLOCK_CACHE_STATES`."""
        def bodies() -> Iterator[tuple[BlockState, Lazy[BlockState]]]:
            for body in self._gen.bodies(self._gen.start(specs), part):
                yield body, Lazy(partial(self._gen.posts, body))

        lazy = self.block_cache.use(_space_key(specs, part), lambda: Lazy(bodies))
        for body, graphs in lazy:
            if cut is not None and cut(body):
                continue
            for state in graphs:
                self._tick()
                yield state

    def _program_blocks(self, s: KState, specs: Sequence[InputSpec], program: Program) -> Iterator[BlockState]:
        """The block graphs computing `program` over the tensors of `s` that `specs` read (its
        inputs are named by their ids)."""
        tiles = {s.tensors[sp.tensor].id: k for k, sp in enumerate(specs)}
        for state in self._gen.program_graphs(self._gen.start(specs), program, tiles):
            self._tick()
            yield state

    def _overflows(self, ae: AE, chunk: Chunk | None) -> bool:
        """Could a tensor of this value, stored between kernels in the program's dtype, overflow
        it where the program does not (`Floors.stored`)? Per-chunk partial sums are no value of
        the program."""
        stored = self.floors.stored
        return stored is not None and (chunk is not None or self.oracle.class_of(ae) not in stored)

    def _repeats(self, s: KState, ae: AE, shape: tuple[Size, ...], chunk: Chunk | None,
                 classes: tuple[int, ...]) -> bool:
        """Does a tensor of the state hold this value already? Same expression, shape, chunking
        and dim classes: a transpose keeps the expression (and a square one the shape) but not
        the classes."""
        return any(t.ae == ae and t.shape == shape and t.chunk == chunk and t.classes == classes for t in s.tensors)

    # -- candidates ------------------------------------------------------------------------------
    def _candidate(self, s: KState) -> SGraph | None:
        chosen: list[str] = []
        for i in range(len(self.floors.outputs)):
            match = next(
                (t for t in reversed(s.tensors)
                 if t.chunk is None and t.id not in chosen and self.floors.is_output(t.ae, t.shape, t.classes, i)),
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
        try:
            sg = SGraph(input_decls(self.program), s.kernels, tuple(chosen), f"{self.program.name}.searched")
            sg.info  # noqa: B018 - validates
        except SGraphError:
            self.pruned += 1
            return None
        if self._stored_values is not None and not self._stored_values.holds(sg):
            self.pruned += 1
            return None  # it stores, in a narrow dtype, a value the program never holds (`StoredValues`)
        return sg


def _cached_graphs(bodies: Lazy[tuple[BlockState, Lazy[BlockState]]]) -> int:
    """The loop bodies and block graphs a block space keeps (`KernelSearch.block_cache`)."""
    return sum(1 + len(graphs) for _, graphs in bodies.produced())


def _space_key(specs: Sequence[InputSpec], part: tuple[int, int]) -> tuple[Any, ...]:
    """What a part of a block space depends on: its inputs' shapes, values, classes and ties."""
    return (part, *((sp.shape, sp.ae, sp.classes, sp.tied_dim) for sp in specs))


def _tuples(indices: Sequence[int], arity: int) -> Iterator[tuple[int, ...]]:
    if arity == 1:
        for i in indices:
            yield (i,)
    else:
        for i in indices:
            for j in indices:
                yield (i, j)


def _reshapes(k: Kernel) -> bool:
    return isinstance(k, LibraryKernel) and k.op == Op.RESHAPE


def _signature(k: GraphKernel) -> str:
    b = k.block
    parts = [f"{len(b.grid)}:{b.loop.size}"]
    parts += [f"i{i.tensor}{i.imap}{i.fmap}" for i in b.inputs]
    parts += [f"{o.op}{o.inputs}{sorted(o.attrs.items())}" for o in (*b.body, *b.post)]
    parts += [f"a{a.source}{a.kind}{a.dim}" for a in b.accumulators]
    parts += [f"o{o.source}{o.omap}" for o in b.outputs]
    return "|".join(parts)


ConcreteAxis = tuple[frozenset[int], int]  # program dim classes a grid axis splits (side by side when more), size


def concrete_tilings(specs: Sequence[InputSpec], max_axes: int = 3,
                     ) -> Iterator[tuple[list[ConcreteAxis], tuple[frozenset[int], int]]]:
    """Every concrete choice of at most `max_axes` grid axes (`ConcreteAxis`) and loop (classes,
    range) for these inputs, in a fixed order (`_concrete_grids`), each with a loop over one or
    two classes (or none) whose range divides what it walks."""
    extent: dict[int, int] = {}
    owners: dict[int, set[int]] = {}
    for sp in specs:
        for size, c in zip(sp.shape, sp.classes, strict=True):
            if c != -1 and size > 1:
                extent[c] = size
                owners.setdefault(c, set()).add(sp.tensor)
    classes = sorted(extent)
    for axes in _concrete_grids(classes, _concrete_groups(classes, extent, owners), extent, max_axes):
        split = {c: size for group, size in axes for c in group}
        for n_loop in (0, 1, 2):
            for walked in combinations(classes, n_loop):
                for rng in LOOP_RANGES if walked else (1,):
                    left = {c: extent[c] // split.get(c, 1) for c in walked}
                    if all(left[c] % rng == 0 and left[c] > rng for c in walked):
                        yield axes, (frozenset(walked), rng)


def _concrete_groups(classes: list[int], extent: dict[int, int], owners: dict[int, set[int]]) -> list[frozenset[int]]:
    """Groups of classes one grid axis may split side by side: two or more, each of one input
    only, no two of the same input, all of one extent (the columns of X @ Wq and X @ Wk; the
    symbolic search's `tiling._side_by_side` also pairs products' columns of different widths)."""
    own = [c for c in classes if len(owners[c]) == 1]
    groups = []
    for n in range(2, len(own) + 1):
        for group in combinations(own, n):
            if len({extent[c] for c in group}) == 1 and len(set().union(*(owners[c] for c in group))) == n:
                groups.append(frozenset(group))
    return groups


def _concrete_grids(classes: list[int], groups: list[frozenset[int]], extent: dict[int, int], max_axes: int,
                    ) -> Iterator[list[ConcreteAxis]]:
    """One block (an axis of size 1, as the symbolic search instantiates one), then 1 to
    `max_axes` axes on distinct classes (in class order: permuted grids are the same schedule),
    each of a size n / tile for Mirage's tiles (a class no tile divides is not split: an axis of
    size 1 would be the grid without it again); then the grids with side-by-side axes over
    `groups`."""
    if classes:
        yield [(frozenset({classes[0]}), 1)]
    singles = [frozenset({c}) for c in classes]
    for options in (singles, singles + groups):
        for n_axes in range(1, max_axes + 1):
            for chosen in combinations(options, n_axes):
                if options is not singles and all(len(o) == 1 for o in chosen):
                    continue  # listed with the singles already
                if len(frozenset().union(*chosen)) < sum(map(len, chosen)):
                    continue  # two axes over one class
                size_options = [[extent[min(o)] // t for t in GRID_TILES if extent[min(o)] % t == 0 and
                                 extent[min(o)] > t] for o in chosen]
                for sizes in _grid_product(size_options):
                    yield list(zip(chosen, sizes, strict=True))


def _grid_product(options: list[list[int]]) -> Iterator[tuple[int, ...]]:
    if not options:
        yield ()
        return
    for head in options[0]:
        for rest in _grid_product(options[1:]):
            yield (head, *rest)


def _tile(sp: InputSpec, axes: list[ConcreteAxis], loop: tuple[frozenset[int], int]) -> tuple[int, ...]:
    split = {c: size for group, size in axes for c in group}
    return tuple(
        size // split.get(c, 1) // (loop[1] if c in loop[0] else 1) if c != -1 else size
        for size, c in zip(sp.shape, sp.classes, strict=True)
    )


def _kernel_shapes(program: Program, s: KState, kernel: GraphKernel) -> dict[str, tuple[Size, ...]]:
    """Shapes of a new kernel's outputs, from the sGraph analysis of the state plus the kernel."""
    info = analyze(SGraph(input_decls(program), (*s.kernels, kernel), kernel.outputs, "partial"), require_used=False)
    return {t: info.shapes[t] for t in kernel.outputs}
