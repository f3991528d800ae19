"""Block-level generation: the block graphs of one graph-defined kernel, with maps left symbolic.

Tiles are described by *dim classes* instead of sizes: every dim of every block input starts as a
class of its full size, and ops unify classes (a matmul ties the left operand's last dim to the
right one's second-last, an elementwise op ties aligned dims, a size-1 dim broadcasts). A shape
check is a unification whose sizes agree. Because the maps are not chosen yet, one block graph
stands for every way of tiling it, as in Prism; grid and loop sizes are symbols anyway.

Ops are added in a canonical order (each op's key — its newest operand, operands, op rank,
attributes — exceeds the previous op's), so every block graph is generated once. A run of the
program's elementwise ops (`Chain`: bias adds, scales, activations) is one op of its own, made
only whole and in the program's order; its inner values are never tiles. Every new tile
must have an abstract expression present in the target's saturated e-graph (the oracle); a tile
whose value (its abstract expression's e-class, and its numeric fingerprint: abstract values drop
constant factors, a mean's 1/n among them) and dims repeat an existing one's is a duplicate
computation and cut.

A complete block graph's tilings (grid axes, loop, maps, accumulators) are `search.tiling`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations, product
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np

from superopt import ops
from superopt.config import MAX_ACCUMULATORS, MAX_OUTPUTS, PART_ACCUMULATORS
from superopt.object_cache import BoundedDict
from superopt.ops import Op
from superopt.primitives import apply
from superopt.program import Node, Program, Tensor
from superopt.reference import FloatAlgebra
from superopt.search.fingerprint import SEED, SIZES
from superopt.search.space import ChainOp, Space, chain_runs, chain_steps
from superopt.verifier.oracle import AE, AV, AbstractAlgebra, Oracle

T = TypeVar("T")
V = TypeVar("V")
OpRanks = tuple[tuple[str, int], ...]  # ops with their canonical ranks
Step = tuple[str, tuple[int, ...], tuple[Any, ...], tuple[Any, ...]]  # an op: op, operands, attrs, consts
RankedStep = tuple[str, int, tuple[Any, ...], tuple[Any, ...]]  # a one-operand op: op, rank, attrs, consts
# A loop body with its accumulators, as a walk in parts hands it over: its place in the
# breadth-first order (level, path, accumulator choice), its signature's digest and its ops.
Body = tuple[tuple[int, tuple[int, ...], int], int, tuple[Step, ...]]
Signature = tuple[Any, ...]  # what the post-loop graphs over a loop body's accumulators depend on (`_signature`)
COMMUTATIVE = (Op.ADD, Op.MUL)  # binary ops generated with their older operand first only
CHAIN = "chain"  # the block op of a whole elementwise chain (`Chain`); its attributes hold the chain's ops
UNIT = -1  # the class of a size-1 dim: broadcasts against anything, never split
SPLIT_WIDTH = 4  # a loop-body walk in parts deals out the first level this many times wider than parts
POST_ENTRIES = 1 << 16  # accumulator signatures whose post-loop graphs are kept (`posts`)
BODY_CACHE_ENTRIES = 4  # block spaces whose accumulated loop bodies are kept (least recently used go)


class Classes(NamedTuple):
    """A persistent union-find over block dim classes (states share it; a union makes a new one).
    Each class also has the program dim class it stands for; only equal ones may unify. (Named
    tuples, like tiles and states: made for every op tried, and quicker to make than frozen
    dataclasses.)"""

    parent: tuple[int, ...] = ()
    size: tuple[int, ...] = ()
    program: tuple[int, ...] = ()

    def find(self, i: int) -> int:
        if i == UNIT:
            return UNIT
        while self.parent[i] != i:
            i = self.parent[i]
        return i

    def add(self, size: int, program_class: int) -> tuple[Classes, int]:
        n = len(self.parent)
        return Classes((*self.parent, n), (*self.size, size), (*self.program, program_class)), n

    def union(self, i: int, j: int) -> Classes | None:
        ri, rj = self.find(i), self.find(j)
        if ri == rj:
            return self
        if UNIT in (ri, rj) or self.size[ri] != self.size[rj] or self.program[ri] != self.program[rj]:
            return None
        parent = list(self.parent)
        parent[max(ri, rj)] = min(ri, rj)
        return Classes(tuple(parent), self.size, self.program)




class Tile(NamedTuple):
    op: str  # "input", a block op, or "acc"
    args: tuple[int, ...]
    attrs: tuple[tuple[str, Any], ...]
    phase: int  # 0: inputs and loop body; 1: accumulators and post-loop ops
    dims: tuple[int, ...]
    ae: AE
    pdims: tuple[int, ...]  # program dim class of each dim (fixed: only equal classes unify)
    tensor: int = -1  # for inputs: the kernel tensor index
    aid: int = -1  # the expression's interned id (cheap to hash and compare)
    vid: int = -1  # the value's id: equal for expressions equal under the target's axioms (`_vid`)
    fid: int = -1  # its numeric fingerprint's id (`_fid`): tells apart values one abstract value stands for
    gathers: bool = False  # an accumulator of an unreduced non-input tile (see `Generator._reduced`)
    consts: tuple[tuple[int, float], ...] = ()  # constant operands: (position, value)


class BlockState(NamedTuple):
    tiles: tuple[Tile, ...]
    classes: Classes
    used: frozenset[int]
    nops: int
    last_key: tuple[Any, ...]
    tied: tuple[tuple[int, int], ...] = ()  # (input tile, dim) walked by a loop tied to a chunk axis

    def reordered(self) -> BlockState:
        """The same state with a new canonical order (for the next phase's ops)."""
        return BlockState(self.tiles, self.classes, self.used, self.nops, (), self.tied)


@dataclass
class InputSpec:
    tensor: int  # index of the kernel tensor
    shape: tuple[int, ...]  # block-visible full sizes (a tied chunk dim has its base size)
    ae: AE
    classes: tuple[int, ...]  # the program dim class of each dim
    tied_dim: int | None = None


class Lazy(Generic[T]):
    """A memoized generator: iterating again replays the items produced so far, then resumes.
    An exception out of the generator (a budget, a bound that cuts a walk: `KernelSearch`) ends
    it; an iteration that needs more items later makes it again (`make`) and passes over those it
    had produced."""

    def __init__(self, make: Callable[[], Iterator[T]]) -> None:
        self._make = make
        self._source: Iterator[T] | None = None
        self._skip = 0  # items a remade generator produces again before new ones
        self._items: list[T] = []
        self._done = False

    def __iter__(self) -> Iterator[T]:
        i = 0
        while True:
            if i < len(self._items):
                yield self._items[i]
                i += 1
            elif self._done:
                return
            else:
                self._produce()

    def _produce(self) -> None:
        if self._source is None:
            self._source, self._skip = self._make(), len(self._items)
        try:
            item = next(self._source)
        except StopIteration:
            self._done = True
            return
        except BaseException:
            self._source = None
            raise
        if self._skip:
            self._skip -= 1
        else:
            self._items.append(item)

    def __len__(self) -> int:
        """The items produced so far."""
        return len(self._items)

    def produced(self) -> list[T]:
        """The items produced so far (read only)."""
        return self._items


@dataclass
class Generator:
    space: Space
    oracle: Oracle
    max_ops: int
    states: int = 0
    pruned: int = 0
    on_state: Callable[[], None] | None = None  # called for every state (budgets, progress)
    # The symbolic search's `resolve` offers every block graph without a loop, which makes an
    # empty loop body redundant (see _with_accumulators); a concrete search fixed its loop first.
    no_loop_tilings: bool = True
    max_outputs: int = MAX_OUTPUTS  # values a block graph may write
    # The e-classes a block matmul may read from a tile computed in the kernel (None: any). Its
    # operands are staged in the program's dtype for the tensor cores (`sgraph._storage_plan`),
    # where a value the program never holds may overflow a narrow one (f16) that the program's
    # own values fit (`KernelSearch._overflows` holds tensors between kernels to the same rule).
    staged: frozenset[str | None] | None = None
    alg: AbstractAlgebra = field(init=False)  # the oracle's (it knows the program's constant factors)

    def __post_init__(self) -> None:
        self.alg = self.oracle.alg
        self._rank = {op: i for i, op in enumerate((*self.space.block_ops, CHAIN, "acc"))}
        self._memo: dict[tuple[Any, ...], tuple[AE, tuple[int, ...], int] | None] = {}
        self._post_memo: BoundedDict[tuple[Any, ...], tuple[int, list[tuple[Any, ...]]]] = BoundedDict(POST_ENTRIES)
        self._bodies: BoundedDict[BlockState, Lazy[tuple[Signature, BlockState]]] = BoundedDict(BODY_CACHE_ENTRIES)
        # bodies handed over by `adopt_bodies`, by start state and part
        self._adopted: dict[tuple[BlockState, tuple[int, int]], Lazy[tuple[Signature, BlockState]]] = {}
        self._pair_memo: dict[tuple[Any, ...], tuple[OpRanks, OpRanks, int]] = {}
        self._single_memo: dict[tuple[Any, ...], tuple[list[RankedStep], list[RankedStep]]] = {}
        self._ids: dict[AE, int] = {}
        self._exprs: list[AE] = []
        self._vids: list[int] = []  # by interned id, filled on demand (see `_vid`)
        self._floats = FloatAlgebra(None)
        self._values: list[np.ndarray] = []  # by fingerprint id (see `_fid`)
        self._fids: dict[bytes, int] = {}
        self._fid_memo: dict[tuple[Any, ...], int] = {}
        self._vid_of_class: dict[str, int] = {}
        self._subterms: dict[tuple[int, int], bool] = {}
        self._reductions: dict[int, bool] = {}  # by interned expression: `_reduced`
        self._binary_ops = [op for op in self.space.block_ops if op in ops.BINARY or op == Op.MATMUL]
        # A chain's inner values are made by its step only (`Chain`): no other op may make one.
        outer = {self.oracle.class_of(e) for e in self.space.outer}
        self._inner = {c for chain in self.space.chains for e in chain.inner
                       if (c := self.oracle.class_of(e)) is not None and c not in outer}
        # each chain's step attributes, and the e-classes and program dim classes of its operands
        self._chains = [((("ops", chain.ops),), [(self.oracle.class_of(e), dims) for e, dims in chain.operands])
                        for chain in self.space.chains]
        # the most tiles one op reads less the one it makes: how far it can lower the unread ones
        self._merged = max([2, *(len(chain.operands) for chain in self.space.chains)]) - 1

    def forget(self) -> None:
        """Break the reference cycles that keep a finished search alive (lazily walked loop bodies
        whose generators refer back to this generator, the progress callback), so that dropping
        it frees it by reference counting, not only at a full collection."""
        self._bodies.clear()
        self._adopted.clear()
        self.on_state = None

    # -- start and moves -------------------------------------------------------------------------
    def start(self, inputs: Sequence[InputSpec]) -> BlockState:
        classes = Classes()
        tiles = []
        tied = []
        for n, spec in enumerate(inputs):
            dims = []
            for size, pc in zip(spec.shape, spec.classes, strict=True):
                if size == 1:
                    dims.append(UNIT)
                else:
                    classes, c = classes.add(size, pc)
                    dims.append(c)
            pdims = tuple(UNIT if d == UNIT else pc for d, pc in zip(dims, spec.classes, strict=True))
            aid = self._intern(spec.ae)
            rng = np.random.default_rng((SEED, spec.tensor))
            value = rng.uniform(0.5, 1.5, tuple(1 if d == UNIT else SIZES[pc % len(SIZES)] for d, pc in zip(
                dims, spec.classes, strict=True)))
            tiles.append(Tile("input", (), (), 0, tuple(dims), spec.ae, pdims, spec.tensor, aid, self._vid(aid),
                              self._intern_value(value)))
            if spec.tied_dim is not None:
                tied.append((n, spec.tied_dim))
        return BlockState(tuple(tiles), classes, frozenset(), 0, (), tuple(tied))

    def complete_graphs(self, start: BlockState, part: tuple[int, int] = (1, 0)) -> Iterator[BlockState]:
        """Complete block graphs, generated phase by phase: loop-body graphs breadth-first (small
        first: the search is anytime), then for each the choices of accumulators (every body tile
        nothing reads, plus optionally others, at most `MAX_ACCUMULATORS`), then the post-loop
        graphs over those accumulators. Any block graph can be ordered body, accumulators, post,
        so nothing is lost; and the post-loop graphs depend only on the accumulators, so they are
        computed once per distinct set of accumulators and replayed. `max_ops` bounds the compute
        ops (body and post-loop together).

        `part` = (parts, index) keeps only the accumulator signatures whose stable digest falls in
        this part: distributed search splits one block space across workers this way. Every part
        needs the loop bodies: walked whole once per process, or walked in parts beforehand
        (`body_part`) and handed over, only this part's (`adopt_bodies`)."""
        for body in self.bodies(start, part):
            yield from self.posts(body)

    def bodies(self, start: BlockState, part: tuple[int, int] = (1, 0)) -> Iterator[BlockState]:
        """This part's loop bodies with their accumulators, each the start of its post-loop graphs
        (`posts`): where a search may bound every block graph of a body at once."""
        adopted = self._adopted.get((start, part))
        for signature, state in adopted if adopted is not None else self._accumulated(start):
            if part[0] == 1 or self._digest(signature) % part[0] == part[1]:  # (the digest only splits)
                yield state

    def body_part(self, start: BlockState, part: tuple[int, int]) -> list[Body]:
        """This part's share of the loop bodies with their accumulators (see `_phase`), each with
        its place in the breadth-first order of the whole walk, for `adopt_bodies`. A body whose
        accumulators an earlier body of this part already has is left out: that one precedes it
        in the whole walk too."""
        seen: set[tuple[Any, ...]] = set()
        out: list[Body] = []
        for path, body in self._phase(start, 0, self.max_ops, part):
            for n, state in enumerate(self._with_accumulators(body)):
                signature = _signature(state, _first_post(state))
                if signature not in seen:
                    seen.add(signature)
                    steps = tuple((t.op, t.args, t.attrs, t.consts) for t in state.tiles[len(start.tiles):])
                    out.append(((len(path), path, n), self._digest(signature), steps))
        return out

    def adopt_bodies(self, start: BlockState, bodies: Sequence[Body], part: tuple[int, int] = (1, 0)) -> None:
        """Take the loop bodies of `start` from the parts of a walk (`body_part`, all parts, in
        any order) instead of walking them, those whose digest falls in `part`: rebuilt in
        breadth-first order, they are exactly those `_accumulated` keeps for that part, in its
        order. Kept for the life of this generator."""
        if (start, part) in self._adopted:
            return
        built: dict[tuple[Any, ...], BlockState | None] = {(): start}  # bodies share prefixes
        states = []
        for _, digest, recipe in sorted(bodies):
            if digest % part[0] != part[1]:
                continue
            steps = [step for step in recipe if step[0] != "acc"]
            done = len(steps)
            while tuple(steps[:done]) not in built:
                done -= 1
            state = built[tuple(steps[:done])]
            for k in range(done, len(steps)):
                state = self._try(state, *steps[k]) if state else None
                built[tuple(steps[: k + 1])] = state
            state = state.reordered() if state else None  # accumulators: a new canonical order
            for step in recipe[len(steps):]:
                state = self._try(state, *step) if state else None
            if state is None:
                raise ValueError(f"a loop body handed over does not rebuild here: {recipe}")
            states.append(state.reordered())
        self._adopted[start, part] = Lazy(lambda: self._first_per_signature(iter(states)))

    def program_graphs(self, start: BlockState, program: Program, tiles: Mapping[str, int]) -> Iterator[BlockState]:
        """The complete block graphs computing the program (`tiles`: the start tile of each
        program input), tiled later like any block graph: the one-kernel fusion of the whole
        program. First with every op in the loop body, its accumulators written as they are; then,
        when the program has ops that only finish products (`_post_loop_ops`: silu(X @ Wg) *
        (X @ Wu)), with those after the loop over the products' accumulators, so that a loop can
        walk the products' shared dim (silu of a partial sum is not the sum). Nothing when an op
        cannot be a block op here (not in the space, or refused by `_try`: the op bound, a value
        computed twice)."""
        ops_ = [n for n in program.topological() if n.op not in ("input", Op.CONST)]
        placed = self._place(start, ops_, program, tiles)
        if placed is not None:
            # The body computes the program: an op after the loop would compute something else,
            # so the accumulators are written as they are (post-loop graphs over a large part's
            # accumulators are many, and none of them is wanted), as many as there are
            # (`max_outputs` bounds what the search grows; this graph is given).
            yield from (accs for accs in self._with_accumulators(placed[0], PART_ACCUMULATORS)
                        if self.complete(accs, MAX_ACCUMULATORS))
        # After the products: the program's post-loop ops, and with them its norms that only
        # products read (`_norms_after_products`): a loop may then walk the normalized dim too.
        for form in (program, _norms_after_products(program)):
            if form is not None:
                yield from self._post_loop_graphs(start, form, tiles)
        # Its scales moved into the products' smaller operands (`_scales_into_smaller_operand`):
        # the scale then runs in the loop body, and what follows it may finish after the loop.
        scaled = _scales_into_smaller_operand(program)
        if scaled is not None:
            ops_ = [n for n in scaled.topological() if n.op not in ("input", Op.CONST)]
            placed = self._place(start, ops_, scaled, tiles)
            if placed is not None:
                yield from (accs for accs in self._with_accumulators(placed[0], PART_ACCUMULATORS)
                            if self.complete(accs, MAX_ACCUMULATORS))
            yield from self._post_loop_graphs(start, scaled, tiles)

    def _post_loop_graphs(self, start: BlockState, program: Program, tiles: Mapping[str, int]) -> Iterator[BlockState]:
        """`program` as one block graph whose ops that only finish products (`_post_loop_ops`) run
        after the loop over the accumulators of the rest."""
        ops_ = [n for n in program.topological() if n.op not in ("input", Op.CONST)]
        post = _post_loop_ops(program)
        placed = self._place(start, [n for n in ops_ if n.id not in post], program, tiles) if post else None
        if placed is None:
            return
        body, where = placed
        for accs in self._with_accumulators(body, PART_ACCUMULATORS):
            accumulated = {node: k for node, tile in where.items() for k, t in enumerate(accs.tiles)
                           if t.op == "acc" and t.args == (tile,)}
            done = self._place(accs, [n for n in ops_ if n.id in post], program, accumulated)
            if done is not None and self.complete(done[0], MAX_ACCUMULATORS):
                yield done[0]

    def _place(self, start: BlockState, nodes: list[Node], program: Program, tiles: Mapping[str, int],
               ) -> tuple[BlockState, dict[str, int]] | None:
        """`start` with these program nodes added in canonical order (always the least key among
        the nodes whose operands are tiles: keys then increase, as `_try` requires), and the tile
        of each node and of `tiles`; None when one cannot be added."""
        placed = dict(tiles)
        pending = self._units(nodes, program)
        state = start
        while pending:
            steps = [(step, unit) for unit in pending
                     if (step := self._program_step(unit, program, placed, state)) is not None]
            if not steps:
                return None
            step, unit = min(steps, key=lambda su: (max(su[0][1]), su[0][1], self._rank[su[0][0]], *su[0][2:]))
            self.states += 1
            if self.on_state is not None:
                self.on_state()
            nxt = self._try(state, *step, written=MAX_ACCUMULATORS)  # a given graph writes what it computes
            if nxt is None:
                return None
            state = nxt
            placed[unit[-1].id] = len(state.tiles) - 1
            pending.remove(unit)
        return state, placed

    def _units(self, nodes: list[Node], program: Program) -> list[list[Node]]:
        """The nodes as the generator's steps: each of the space's chains (`Chain`) one step (the
        longest end of each of the program's runs of elementwise ops that is one: a program a
        norm was moved in has runs with more ops in front), every other node alone."""
        known = {chain.ops for chain in self.space.chains}
        among = {n.id for n in nodes}
        units: list[list[Node]] = []
        grouped: set[str] = set()
        for run in chain_runs(program):
            run = [n for n in run if n.id in among]
            end = next((run[k:] for k in range(len(run) - 1) if chain_steps(program, run[k:])[0] in known), None)
            if end is not None:
                units.append(end)
                grouped.update(n.id for n in end)
        return [[n] for n in nodes if n.id not in grouped] + units

    def _program_step(self, unit: list[Node], program: Program, placed: Mapping[str, int], s: BlockState,
                      ) -> Step | None:
        """A unit of `_units` as a generator step on the tiles of `placed` (None while an operand
        is not a tile yet, or when the op is not one of this space's block ops)."""
        if len(unit) > 1:
            steps, operands = chain_steps(program, unit)
            if any(o not in placed for o in operands):
                return None
            return CHAIN, tuple(placed[o] for o in operands), (("ops", steps),), ()
        n = unit[0]
        if n.op not in self.space.block_ops:
            return None
        args: list[int] = []
        consts: list[tuple[int, float]] = []
        for pos, operand in enumerate(n.inputs):
            node = program.nodes[operand]
            if node.op == Op.CONST:
                consts.append((pos, float(node.attrs["value"])))
            elif operand in placed:
                args.append(placed[operand])
            else:
                return None
        if not args or len(args) + len(consts) != len(n.inputs) or (n.op == Op.MATMUL and consts):
            return None
        if n.op in COMMUTATIVE:
            args.sort()
        named = dict(n.attrs)
        attrs: tuple[tuple[str, Any], ...] = ()
        if "dim" in named:
            dim = named["dim"] % len(s.tiles[args[0]].dims)
            extra = (("keepdim", named["keepdim"]),) if n.op in ops.REDUCE else \
                (("eps", float(named["eps"])),) if n.op == Op.RMS_NORM else ()
            attrs = (("dim", dim), *extra)
        return n.op, tuple(args), attrs, tuple(consts)

    def _accumulated(self, start: BlockState) -> Iterator[tuple[Signature, BlockState]]:
        """Loop bodies with their accumulators chosen, each with its signature. Two loop
        bodies that accumulate the same values (equal signatures) complete into the same post-loop
        graphs; breadth-first order meets the one with fewer ops first, and only that one is kept
        (the other computes the same accumulators with more work). Memoized per start state, so a
        process that runs several parts of one block space enumerates its bodies once (those of the
        `BODY_CACHE_ENTRIES` most recently used start states)."""

        def walk() -> Lazy[tuple[Signature, BlockState]]:
            return Lazy(lambda: self._first_per_signature(
                state for _, body in self._phase(start, 0, self.max_ops) for state in self._with_accumulators(body)))

        return iter(self._bodies.use(start, walk))

    def _first_per_signature(self, states: Iterator[BlockState]) -> Iterator[tuple[Signature, BlockState]]:
        seen: set[tuple[Any, ...]] = set()
        for state in states:
            signature = _signature(state, _first_post(state))
            if signature in seen:
                self.pruned += 1
                continue
            seen.add(signature)
            yield signature, state

    def _with_accumulators(self, body: BlockState, most: int = MAX_ACCUMULATORS) -> Iterator[BlockState]:
        """A loop body's choices of at most `most` accumulators, in a fixed order. An empty body
        over untied inputs has none when the tilings include no loop: its loop would only load the
        inputs for the post-loop graph to compute everything, the same graph computed in the loop
        body with no loop."""
        if body.nops == 0 and not body.tied and self.no_loop_tilings:
            return
        sinks = [k for k in range(len(body.tiles)) if k not in body.used]
        if not sinks or len(sinks) > most:
            return
        # Besides the sinks, a tile the body also reads may be accumulated when it holds a
        # reduction (gathering an unreduced one after the loop adds nothing to compute from) or
        # a program output (written as well: a residual sum returned with its rms_norm).
        read = [k for k in range(len(body.tiles)) if k in body.used and (
            self._reduced(body.tiles[k]) or self.oracle.is_output(body.tiles[k].ae))]
        for extra in range(most - len(sinks) + 1):
            for more in combinations(read, extra):
                state: BlockState | None = body.reordered()
                for k in sorted((*sinks, *more)):
                    state = self._try(state, "acc", (k,), ()) if state else None
                if state is not None:
                    yield state.reordered()

    def _phase(
        self, start: BlockState, phase: int, budget: int, part: tuple[int, int] = (1, 0),
    ) -> Iterator[tuple[tuple[int, ...], BlockState]]:
        """States reachable from `start` by ops of one phase, breadth-first by op count, each with
        its path (its index among its parent's children, from `start` down: the walk's order is
        by length, then path). `part` = (parts, index) walks one part's share: every part walks
        the levels narrower than `SPLIT_WIDTH` x parts states (their states belong to part 0),
        the first wider level is dealt round-robin, and each part walks below its own states."""
        frontier: list[tuple[tuple[int, ...], BlockState]] = [((), start)]
        split = part[0] == 1
        while frontier:
            if not split and len(frontier) >= SPLIT_WIDTH * part[0]:
                frontier, split = frontier[part[1]::part[0]], True
            level: list[tuple[tuple[int, ...], BlockState]] = []
            for path, s in frontier:
                self.states += 1
                if self.on_state is not None:
                    self.on_state()
                if split or part[1] == 0:
                    yield path, s
                # (a state at the budget has no child: its ops are not tried)
                children = (m for m in self._moves(s, phase) if m.nops <= budget) if s.nops < budget else ()
                level.extend(((*path, n), c) for n, c in enumerate(children))
            frontier = level

    def posts(self, accs: BlockState) -> Iterator[BlockState]:
        """Complete post-loop graphs over these accumulators, memoized by their signature without
        fingerprints (what the oracle and the shapes decide). Bodies come in increasing op count,
        so the first request for a signature has the most room left; later ones replay the recipes
        that fit their own room, each op checked again (`_try`): a recipe computing one value
        twice for these accumulators' fingerprints is dropped. (Not generated: a post-loop graph
        needing two values that are one for the first accumulators only; keying the memo with
        fingerprints too would multiply the post-loop walks over attention's Q and K and find the
        same first kernels.) Kept for the last `POST_ENTRIES` signatures: one dropped is walked again
        for the accumulators that next ask for it."""
        first = _first_post(accs)
        key = tuple(entry[:-1] for entry in _signature(accs, first))  # the fingerprint is last
        room = self.max_ops - accs.nops
        computed, recipes = self._post_memo.get(key, (-1, []))
        if room > computed:
            recipes = []
            for _, s in self._phase(accs, 1, self.max_ops):
                if self.complete(s):
                    recipes.append(tuple(_recipe(t, first) for t in s.tiles[len(accs.tiles):]))
            self._post_memo[key] = (room, recipes)
        for recipe in recipes:
            if sum(1 for step in recipe if step[0] != "acc") > room:
                continue
            state: BlockState | None = accs
            for op, args, attrs, consts in recipe:
                if state is not None:
                    state = self._try(state, op, tuple(a + first for a in args), attrs, consts)
            if state is not None:
                yield state

    def _moves(self, s: BlockState, phase: int) -> Iterator[BlockState]:
        for step in self._steps(s, phase):
            child = self._try(s, *step)
            if child is not None:
                yield child

    def _steps(self, s: BlockState, phase: int) -> Iterator[Step]:
        """The ops that may extend `s` in this phase: (op, operands, attributes, constants)."""
        # An op's key starts with its newest operand, and keys must increase: only ops reading a
        # tile at least as new as the previous op's newest operand can follow it.
        newest = s.last_key[0] if s.last_key else -1
        tiles = s.tiles
        mine = [k for k, t in enumerate(tiles) if t.phase == phase]
        recent = [k for k in mine if k >= newest]
        for i in mine:
            if i >= newest:
                admitted, rejected = self._single_ops(tiles[i])
                if i > newest:  # every op's key follows the last op's
                    self.pruned += len(rejected)  # as `_try` would count
                    for op, _, attrs, consts in admitted:
                        yield op, (i,), attrs, consts
                else:
                    self.pruned += sum(1 for _, rank, attrs, consts in rejected
                                       if (i, (i,), rank, attrs, consts) > s.last_key)
                    for op, rank, attrs, consts in admitted:
                        if (i, (i,), rank, attrs, consts) > s.last_key:
                            yield op, (i,), attrs, consts
            a = tiles[i]
            for j in mine if i >= newest else recent:
                # Keys compare by newest operand, then operands: when the newest is the last op's,
                # operands after the last op's all follow it, and those before it none.
                args = (i, j)
                if max(i, j) == newest and args <= s.last_key[1]:
                    if args == s.last_key[1]:
                        yield from self._pairs_after(s, i, j)
                    continue
                b = tiles[j]
                hit = self._pair_memo.get((a.aid, a.pdims, b.aid, b.pdims))
                if hit is None:
                    hit = self._pair_ops(a, b)
                self.pruned += hit[2] if j < i else len(hit[1])  # as `_try` would count
                for op, _ in hit[0]:
                    if j >= i or op not in COMMUTATIVE:
                        yield op, args, (), ()
        yield from self._chain_steps(s, mine, newest)

    def _chain_steps(self, s: BlockState, mine: list[int], newest: int) -> Iterator[Step]:
        """The program's chains (`Chain`) on tiles of this phase holding their operands' values
        (same e-class, same program dim classes), each choice of such tiles."""
        for attrs, operands in self._chains:
            choices = [[k for k in mine if self._holds_value(s.tiles[k], cls, dims)] for cls, dims in operands]
            for args in product(*choices):
                if args and max(args) >= newest:
                    yield CHAIN, tuple(args), attrs, ()

    def inner(self, e: AE) -> bool:
        """Is this a chain's inner value (`Chain`), which only the chain's step makes?"""
        return bool(self._inner) and self.oracle.class_of(e) in self._inner

    def _holds_value(self, t: Tile, cls: str | None, dims: tuple[int, ...]) -> bool:
        """Does a tile hold a value of this e-class laid out with these program dim classes?"""
        return cls is not None and len(t.pdims) == len(dims) and self.oracle.class_of(t.ae) == cls and \
            all(p == d or UNIT in (p, d) for p, d in zip(t.pdims, dims, strict=True))

    def _single_ops(self, t: Tile) -> tuple[list[RankedStep], list[RankedStep]]:
        """The one-operand ops on a tile (unary, reductions and norms over each non-unit dim, ops
        with a constant) with their ranks, in generation order: those the oracle admits and those
        it rejects. Memoized like `_pair_ops`: most are rejected, for the same values again."""
        key = (t.aid, t.pdims, tuple(c == UNIT for c in t.dims))
        hit = self._single_memo.get(key)
        if hit is None:
            steps: list[RankedStep] = []
            for op in self.space.block_ops:
                rank = self._rank[op]
                if op in ops.UNARY:
                    steps.append((op, rank, (), ()))
                elif op in ops.REDUCE or op in ops.NORMALIZE:
                    for d, c in enumerate(t.dims):
                        if c == UNIT:
                            continue
                        if op in ops.REDUCE:
                            for keep in (True, False) if self.space.keepdim_false else (True,):
                                steps.append((op, rank, (("dim", d), ("keepdim", keep)), ()))
                        elif op == Op.RMS_NORM:
                            steps += [(op, rank, (("dim", d), ("eps", eps)), ()) for eps in self.space.constants]
                        else:
                            steps.append((op, rank, (("dim", d),), ()))
                elif op in ops.BINARY:
                    for value in self.space.constants:
                        steps.append((op, rank, (), ((1, value),)))
                        if op in (Op.SUB, Op.DIV):
                            steps.append((op, rank, (), ((0, value),)))
            ok = [self._ae(op, [t], attrs, consts) is not None for op, _, attrs, consts in steps]
            hit = ([st for st, y in zip(steps, ok, strict=True) if y],
                   [st for st, y in zip(steps, ok, strict=True) if not y])
            self._single_memo[key] = hit
        return hit

    def _pairs_after(self, s: BlockState, i: int, j: int) -> list[Step]:
        """Binary ops on the last op's operands i and j: those whose rank follows its rank (add
        and mul commute: only i <= j)."""
        admitted, rejected, _ = self._pair_ops(s.tiles[i], s.tiles[j])
        last_key = s.last_key
        args, swapped = (i, j), j < i
        for op, rank in rejected:
            if not (swapped and op in COMMUTATIVE) and (max(args), args, rank, (), ()) > last_key:
                self.pruned += 1
        return [(op, args, (), ()) for op, rank in admitted
                if not (swapped and op in COMMUTATIVE) and (max(args), args, rank, (), ()) > last_key]

    def _pair_ops(self, a: Tile, b: Tile) -> tuple[OpRanks, OpRanks, int]:
        """The binary ops (with their ranks) whose result on these operands the oracle admits,
        those it rejects, and how many of those are not commutative. The hot path of the whole
        search: a state has a few dozen operand pairs, mostly rejected, and the same operand
        values recur in thousands of states."""
        key = (a.aid, a.pdims, b.aid, b.pdims)
        hit = self._pair_memo.get(key)
        if hit is None:
            ranked = [(op, self._rank[op]) for op in self._binary_ops]
            ok = [self._ae(op, [a, b], (), ()) is not None for op in self._binary_ops]
            rejected = tuple(r for r, y in zip(ranked, ok, strict=True) if not y)
            hit = (tuple(r for r, y in zip(ranked, ok, strict=True) if y), rejected,
                   sum(1 for op, _ in rejected if op not in COMMUTATIVE))
            self._pair_memo[key] = hit
        return hit

    # -- one op ------------------------------------------------------------------------------
    def _try(
        self, s: BlockState, op: str, args: tuple[int, ...], attrs: tuple[tuple[str, Any], ...],
        consts: tuple[tuple[int, float], ...] = (), written: int | None = None,
    ) -> BlockState | None:
        """`s` with one more op, or None when the canonical order, the oracle, shapes or the
        duplicate checks refuse it, or when its block graph can no longer end writing at most
        `written` values (default `max_outputs`) within `max_ops` (a plain call: it runs for every
        op on every state)."""
        key = (max(args), args, self._rank[op], attrs, consts)
        if key <= s.last_key:
            return None
        tiles = [s.tiles[a] for a in args]
        phase = 1 if op == "acc" else tiles[0].phase
        used = s.used.union(args)
        left = s.nops
        if op != "acc":
            # Tiles nothing reads must be read by a later op or written (a body's through its
            # accumulators, which the post-loop graph reads or writes), at most `written` of them;
            # each further op lowers their number by at most its operands less one.
            left += 1
            sinks = 1 + sum(1 for k, t in enumerate(s.tiles) if t.phase == phase and k not in used)
            excess = max(0, sinks - (self.max_outputs if written is None else written))
            if left + -(-excess // self._merged) > self.max_ops:
                self.pruned += 1
                return None
        if op == Op.MATMUL and self.staged is not None and not all(self._fits(s, t) for t in tiles):
            self.pruned += 1
            return None
        abstract = self._ae(op, tiles, attrs, consts)
        if abstract is None:
            self.pruned += 1
            return None
        if phase == 1 and op != "acc" and any(t.gathers for t in tiles):
            return None  # computing on a gathered (unreduced) tile after the loop repeats the in-loop variant
        ae, pdims, aid = abstract
        shaped = self._chain_dims(s.classes, [t.dims for t in tiles], dict(attrs)["ops"]) if op == CHAIN else \
            self._dims(s.classes, op, [t.dims for t in tiles], attrs, bool(consts))
        if shaped is None:
            return None
        classes, dims = shaped
        vid = self._vid(aid)
        # A constant the abstract value absorbs (one the program lacks) scales a value without
        # making another: fingerprints keep that rule, so scaled copies stay duplicates.
        fid = tiles[0].fid if op == "acc" or (consts and aid == tiles[0].aid) else self._fid(op, tiles, attrs, consts)
        if self._holds(s, vid, fid, phase, classes, dims) or \
                (op != "acc" and self._recomputes(s, op, args, aid, phase)):
            self.pruned += 1
            return None  # recomputes an existing tile
        tile = Tile(op, args, attrs, phase, dims, ae, pdims, consts=consts, aid=aid, vid=vid, fid=fid,
                    gathers=op == "acc" and tiles[0].op != "input" and not self._reduced(tiles[0]))
        return BlockState((*s.tiles, tile), classes, used, left, key, s.tied)

    def _reduced(self, t: Tile) -> bool:
        """Has the tile's value reduced something? An accumulator of a tile that nothing has
        reduced and that is not a block input only gathers slices (a concatenation, or the same
        value every iteration): it `gathers`. Memoized by expression."""
        hit = self._reductions.get(t.aid)
        if hit is None:
            hit = self._reductions[t.aid] = _reduces(t.ae)
        return hit

    def _fits(self, s: BlockState, t: Tile) -> bool:
        """May a block matmul read tile `t` of `s` in the program's dtype (`staged`)? An input or
        accumulator (fp32), one of the program's values, or such a value scaled by a constant
        that shrinks it (attention's 1/sqrt(d) on Q)."""
        assert self.staged is not None
        while t.op not in ("input", "acc") and self.oracle.class_of(t.ae) not in self.staged:
            if len(t.args) != 1 or len(t.consts) != 1 or not _shrinks(t.op, *t.consts[0]):
                return False
            t = s.tiles[t.args[0]]
        return True

    def _chain_dims(self, classes: Classes, operands: list[tuple[int, ...]], steps: tuple[ChainOp, ...],
                    ) -> tuple[Classes, tuple[int, ...]] | None:
        """`_dims` of a chain's ops in turn (see `_chained`)."""
        shaped: tuple[Classes, tuple[int, ...]] | None = classes, operands[0]
        for op, refs, consts in steps:
            if shaped is None:
                return None
            shaped = self._dims(shaped[0], op, [shaped[1] if r < 0 else operands[r] for r in refs], (), bool(consts))
        return shaped

    def _dims(
        self, classes: Classes, op: str, tiles: list[tuple[int, ...]], attrs: tuple[tuple[str, Any], ...],
        has_const: bool,
    ) -> tuple[Classes, tuple[int, ...]] | None:
        """The dims of an op's result on operands of these dims, with the classes it unifies."""
        a = tiles[0]
        if op in ops.UNARY or op == "acc" or op in ops.NORMALIZE or (op in ops.BINARY and has_const):
            return classes, a
        if op in ops.REDUCE:
            named = dict(attrs)
            d = named["dim"]
            if named["keepdim"]:
                return classes, (*a[:d], UNIT, *a[d + 1 :])
            return classes, (*a[:d], *a[d + 1 :])
        b = tiles[1]
        if op == Op.MATMUL:
            if len(a) < 2 or len(a) != len(b):
                return None
            cl: Classes | None = classes
            for x, y in zip(a[:-2], b[:-2], strict=True):
                cl = _unify(cl, x, y, broadcast=False)
            cl = _unify(cl, a[-1], b[-2], broadcast=False)
            return None if cl is None else (cl, (*a[:-1], b[-1]))
        # elementwise binary, numpy broadcasting over classes
        out: list[int] = []
        cl = classes
        for k in range(1, max(len(a), len(b)) + 1):
            x = a[-k] if k <= len(a) else UNIT
            y = b[-k] if k <= len(b) else UNIT
            if x == UNIT or y == UNIT:
                out.append(y if x == UNIT else x)
                continue
            cl = _unify(cl, x, y, broadcast=True)
            if cl is None:
                return None
            out.append(x)
        return None if cl is None else (cl, tuple(reversed(out)))

    def _digest(self, signature: tuple[Any, ...]) -> int:
        """A process-independent number for a signature (interned ids are local to a process;
        fingerprints are left out: float rounding may differ between machines, and bodies must
        fall in the same part of a walk on every worker)."""
        stable = repr(tuple((self._exprs[aid], *rest) for aid, *rest, _ in signature))
        return int.from_bytes(hashlib.blake2b(stable.encode(), digest_size=8).digest(), "big")

    def _intern(self, e: AE) -> int:
        aid = self._ids.get(e)
        if aid is None:
            aid = self._ids[e] = len(self._exprs)
            self._exprs.append(e)
        return aid

    def _holds(self, s: BlockState, vid: int, fid: int, phase: int, classes: Classes, dims: tuple[int, ...]) -> bool:
        """Does an existing tile of this phase hold this value (`_vid` and `_fid`) over the same
        dims? (A plain loop: it runs for every new tile against every tile of its state.)"""
        roots = None
        for other in s.tiles:
            if other.vid == vid and other.fid == fid and other.phase == phase:
                if roots is None:
                    roots = tuple(classes.find(d) for d in dims)
                if tuple(classes.find(d) for d in other.dims) == roots:
                    return True
        return False

    def _fid(self, op: str, tiles: list[Tile], attrs: tuple[tuple[str, Any], ...],
             consts: tuple[tuple[int, float], ...]) -> int:
        """The new tile's numeric fingerprint id: its value at the block inputs' fixed random
        values (`start`; float64, rounded to float32 to compare). Abstract values drop constant
        factors, a mean's 1/n among them: sum(X) and mean(X) are one abstract value, and a body
        dividing by one would stand for the body dividing by the other, the one the program
        means lost with it. Memoized like `_ae`."""
        key = (op, attrs, consts, *[t.fid for t in tiles])
        fid = self._fid_memo.get(key)
        if fid is None:
            values = [self._values[t.fid] for t in tiles]
            with np.errstate(all="ignore"):
                result = self._chained(values, dict(attrs)["ops"], self._float) if op == CHAIN else \
                    self._float(op, values, attrs, consts)
            fid = self._fid_memo[key] = self._intern_value(result)
        return fid

    def _float(self, op: str, values: list[np.ndarray], attrs: tuple[tuple[str, Any], ...],
               consts: tuple[tuple[int, float], ...]) -> np.ndarray:
        args = list(values)
        for pos, value in consts:
            args.insert(pos, np.asarray(value, dtype=np.float64))
        return apply(self._floats, op, args, dict(attrs), [a.shape for a in args])

    @staticmethod
    def _chained(operands: list[V], steps: tuple[ChainOp, ...],
                 one: Callable[[str, list[V], tuple[tuple[str, Any], ...], tuple[tuple[int, float], ...]], V]) -> V:
        """A chain's value (`Chain`): its ops in turn, each on the previous one's value (-1) and
        the chain's operands, by `one` (an op's abstract or numeric value)."""
        value = operands[0]  # the first op reads no previous value
        for op, refs, consts in steps:
            value = one(op, [value if r < 0 else operands[r] for r in refs], (), consts)
        return value

    def _intern_value(self, value: np.ndarray) -> int:
        with np.errstate(over="ignore"):  # beyond float32: inf, as good a fingerprint
            key = repr(value.shape).encode() + value.astype(np.float32).tobytes()
        fid = self._fids.get(key)
        if fid is None:
            fid = self._fids[key] = len(self._values)
            self._values.append(value)
        return fid

    def _vid(self, aid: int) -> int:
        """The value an interned expression stands for: the first interned expression of its
        e-class in the target's saturated e-graph (itself when it has none). `(q·c)·k` and
        `q·(k·c)` are one value, and a block computing both does the work twice."""
        while len(self._vids) <= aid:
            n = len(self._vids)
            eclass = self.oracle.class_of(self._exprs[n])
            self._vids.append(n if eclass is None else self._vid_of_class.setdefault(eclass, n))
        return self._vids[aid]

    def _recomputes(self, s: BlockState, op: str, args: tuple[int, ...], aid: int, phase: int) -> bool:
        """Would a new tile (op `op` reading `args`, of expression `aid`) recompute a value the block
        already has? Either an existing tile of its phase already contains the expression (the new
        one repeats part of it), or it contains an existing tile's expression without being built
        from that tile while one op of the space builds it from that tile (`_one_op_from`): that
        schedule, reusing the value, is generated too. (Without such an op, as for rsqrt(X) beside
        sqrt(X) when the program divides nothing, computing it again is the only way.) A unary op
        of the operand an existing unary op reads is not refused for lying inside it (sigmoid(X)
        beside silu(X)): the existing one is whole, and rebuilding it from the new one takes ops
        (a product with X) the space may not have; when it has them, that schedule comes too."""
        ancestors = set(args)
        stack = list(args)
        while stack:
            for a in s.tiles[stack.pop()].args:
                if a not in ancestors:
                    ancestors.add(a)
                    stack.append(a)
        for k, t in enumerate(s.tiles):
            if t.phase != phase or t.op == "input" or k in ancestors:
                continue
            if (self._inside(aid, t.aid) and not (op in ops.UNARY and t.op in ops.UNARY and t.args == args)) or \
                    (self._inside(t.aid, aid) and self._one_op_from(s, k, aid)):
                return True
        return False

    def _one_op_from(self, s: BlockState, k: int, aid: int) -> bool:
        """Does one op of the space build expression `aid` from tile k (alone, with a constant,
        or with another tile of its phase)?"""
        t = s.tiles[k]
        if any(self._built(op, [t], attrs, consts) == aid for op, _, attrs, consts in self._single_ops(t)[0]):
            return True
        return any(self._built(op, pair, (), ()) == aid for other in s.tiles if other.phase == t.phase
                   for pair in ([t, other], [other, t]) for op, _ in self._pair_ops(*pair)[0])

    def _built(self, op: str, tiles: list[Tile], attrs: tuple[tuple[str, Any], ...],
               consts: tuple[tuple[int, float], ...]) -> int | None:
        hit = self._ae(op, tiles, attrs, consts)
        return None if hit is None else hit[2]

    def _inside(self, small: int, big: int) -> bool:
        key = (small, big)
        hit = self._subterms.get(key)
        if hit is None:
            hit = self._subterms[key] = _subterm(self._exprs[small], self._exprs[big])
        return hit

    def _ae(
        self, op: str, tiles: list[Tile], attrs: tuple[tuple[str, Any], ...], consts: tuple[tuple[int, float], ...],
    ) -> tuple[AE, tuple[int, ...], int] | None:
        """The new tile's abstract value (expression, program dim classes, interned id), or None
        when the target does not contain it (memoized: the same operands recur in many states).
        An accumulator adds nothing: a sum of partial sums over the dim its loop walks is that
        same sum."""
        if op == "acc":
            return tiles[0].ae, tiles[0].pdims, tiles[0].aid
        key = (op, attrs, consts, *[(t.aid, t.pdims) for t in tiles])
        hit = self._memo.get(key, _MISSING)
        if hit is not _MISSING:
            return hit  # type: ignore[return-value]
        if op == Op.MATMUL and any(len(t.pdims) < 2 for t in tiles):
            self._memo[key] = None  # no product of a vector or a 0-d view (a scalar buffer's)
            return None
        operands: list[AV] = [(t.ae, t.pdims) for t in tiles]
        value = self._chained(operands, dict(attrs)["ops"], self._abstract) if op == CHAIN else \
            self._abstract(op, operands, attrs, consts)
        admitted = self.oracle.contains(value[0]) and (op == CHAIN or not self.inner(value[0]))
        result = (*value, self._intern(value[0])) if admitted else None
        self._memo[key] = result
        return result

    def _abstract(self, op: str, operands: list[AV], attrs: tuple[tuple[str, Any], ...],
                  consts: tuple[tuple[int, float], ...]) -> AV:
        args = list(operands)
        for pos, value in consts:
            args.insert(pos, self.alg.const(value))
        return self.alg.apply(op, args, dict(attrs), [])

    # -- completeness ----------------------------------------------------------------------------
    def complete(self, s: BlockState, max_outputs: int | None = None) -> bool:
        """Every body tile is read or accumulated, and at most `max_outputs` (default: the
        generator's) post-loop values are left to write."""
        if not any(t.op == "acc" for t in s.tiles):
            return False
        for k, t in enumerate(s.tiles):
            if t.phase == 0 and k not in s.used:
                return False
        written = sum(1 for k, t in enumerate(s.tiles) if t.phase == 1 and k not in s.used)
        return written <= (self.max_outputs if max_outputs is None else max_outputs)


def _post_loop_ops(program: Program) -> set[str]:
    """The program's ops that may run after a loop over its products: no product reads them (or
    anything computed from them), they read no program input, they reduce nothing the loop body
    computes (a partial reduction accumulates), and nothing of the loop body reads them; they
    read the body's values only through their accumulators."""
    ops_ = [n for n in program.topological() if n.op not in ("input", Op.CONST)]
    inputs = {n.id for n in program.nodes.values() if n.op == "input"}
    body: set[str] = set()
    for n in ops_:
        if n.op == Op.MATMUL or any(i in inputs for i in n.inputs) or (n.op in ops.REDUCE and n.inputs[0] in body):
            body.add(n.id)
    runs = chain_runs(program)
    grown = -1
    while grown != len(body):  # a chain is one step: all in the body when any of it is
        grown = len(body)
        for n in reversed(ops_):  # what the body and the products read is body too
            if n.id in body:
                body.update(i for i in n.inputs if program.nodes[i].op not in ("input", Op.CONST))
        for run in runs:
            if any(n.id in body for n in run):
                body.update(n.id for n in run)
    return {n.id for n in ops_ if n.id not in body}


def _norms_after_products(program: Program) -> Program | None:
    """The program with each rms_norm over the last dim that only products read, as their left
    operand, applied to the products instead: rms_norm(X) @ W = (X @ W) / sqrt(mean(X^2) + eps),
    the mean taken beside the product in the loop over X's columns (the rmsnorm_matmul winner's
    form); None when it has no such norm."""
    readers: dict[str, list[Node]] = {}
    for n in program.topological():
        for i in n.inputs:
            readers.setdefault(i, []).append(n)
    norms = {n.id for n in program.topological() if n.op == Op.RMS_NORM and n.id not in program.outputs
             and n.attrs["dim"] % len(n.shape) == len(n.shape) - 1 and n.id in readers
             and all(r.op == Op.MATMUL and r.inputs[0] == n.id != r.inputs[1] for r in readers[n.id])}
    if not norms:
        return None
    out = Program(program.name)
    value: dict[str, Tensor] = {}
    scale: dict[str, Tensor] = {}  # each norm's divisor, by the norm's id
    for n in program.topological():
        if n.op == "input":
            value[n.id] = out.input(n.id, n.shape, n.dtype or "f32")
        elif n.id in norms:
            x = value[n.inputs[0]]
            ms = out.op(Op.MEAN, out.op(Op.SQUARE, x), dim=-1, keepdim=True)
            scale[n.id], value[n.id] = out.op(Op.SQRT, out.op(Op.ADD, ms, float(n.attrs["eps"]))), x
        elif n.op != Op.CONST:
            args = [float(program.nodes[i].attrs["value"]) if program.nodes[i].op == Op.CONST else value[i]
                    for i in n.inputs]
            v = out.op(n.op, *args, **dict(n.attrs))
            value[n.id] = out.op(Op.DIV, v, scale[n.inputs[0]]) if n.inputs[0] in scale else v
    out.output(*(value[o] for o in program.outputs))
    return out


def program_forms(program: Program) -> list[Program]:
    """Equal forms of the program that change what a kernel computes where, proposed as starting
    points of the search (the oracle admits their values, `Oracle(program, forms)`); a candidate
    built from one is proved against the program itself, like any other."""
    return [form for form in (_scales_into_smaller_operand(program),) if form is not None]


def _scales_into_smaller_operand(program: Program) -> Program | None:
    """The program with each scale of a product moved into the product's smaller operand, where
    the algebra is exact: (X @ W) * s = (X * s) @ W for s constant along the product's columns
    (a constant, or r of shape (M, 1)), = X @ (W * s) for s constant along its rows (s of shape
    (1, N)); a quotient (X @ W) / s likewise. Scaling the smaller operand touches fewer elements,
    and the scale then runs in the loop over the products' shared dim. A column scale of a product
    whose columns are then summed (or averaged) goes into W whatever the sizes: the row sums are
    then X @ rowsum(W * s), W reduced once where it is read anyway. Only products nothing else
    reads nor returns, and scales no elementwise chain holds (`chain_runs`: moved out, the rest of
    the chain is no chain of the space); None when the program has no such scale."""
    readers: dict[str, list[Node]] = {}
    for n in program.topological():
        for i in n.inputs:
            readers.setdefault(i, []).append(n)
    moves: dict[str, tuple[str, int, str]] = {}  # scaling node -> (its product, operand index, scale)
    chained = {n.id for run in chain_runs(program) for n in run}
    for n in program.topological():
        if n.op not in (Op.MUL, Op.DIV) or len(n.inputs) != 2 or n.id in chained:
            continue  # a scale in a chain is one block op with the chain's other ops already
        for pos in (0, 1) if n.op == Op.MUL else (0,):
            m = program.nodes[n.inputs[pos]]
            scale = program.nodes[n.inputs[1 - pos]]
            if m.op != Op.MATMUL or m.id in program.outputs or len(readers.get(m.id, [])) != 1 or \
                    len(m.shape) < 2 or n.shape != m.shape or scale.id == m.id:
                continue
            after = readers.get(n.id, [])
            columns_reduced = len(after) == 1 and after[0].op in (Op.SUM, Op.MEAN) and \
                after[0].attrs["dim"] % len(n.shape) == len(n.shape) - 1
            into = _scaled_operand(program, m, scale, columns_reduced)
            if into is not None:
                moves[n.id] = (m.id, into, scale.id)
                break
    if not moves:
        return None
    out = Program(program.name)
    value: dict[str, Tensor] = {}
    moved = {m for m, _, _ in moves.values()}
    for n in program.topological():
        if n.op == "input":
            value[n.id] = out.input(n.id, n.shape, n.dtype or "f32")
        elif n.id in moved or n.op == Op.CONST:
            continue
        elif n.id in moves:
            m_id, into, scale_id = moves[n.id]
            by = program.nodes[scale_id]
            factor: Tensor | float = float(by.attrs["value"]) if by.op == Op.CONST else value[scale_id]
            operands = [value[i] for i in program.nodes[m_id].inputs]
            operands[into] = out.op(n.op, operands[into], factor)
            value[n.id] = out.op(Op.MATMUL, *operands)
        else:
            args = [float(program.nodes[i].attrs["value"]) if program.nodes[i].op == Op.CONST else value[i]
                    for i in n.inputs]
            value[n.id] = out.op(n.op, *args, **dict(n.attrs))
    out.output(*(value[o] for o in program.outputs))
    return out


def _scaled_operand(program: Program, m: Node, scale: Node, columns_reduced: bool = False) -> int | None:
    """Which operand of product `m` (0: X, 1: W) a scale of its result may move into: X when the
    scale is constant along the result's columns, W when along its rows, each only when that
    operand has fewer elements than the other, or for W when the scaled result's columns are
    reduced next (`columns_reduced`); None when neither."""
    x, w = (program.nodes[i] for i in m.inputs)
    if len(x.shape) != len(m.shape) or len(w.shape) != len(m.shape) or x.shape[:-2] != w.shape[:-2]:
        return None  # a broadcast batch: the scale's batch dims would not be the operand's
    if scale.op == Op.CONST:
        into_x = into_w = True
    else:
        s = scale.shape  # broadcast into the product: then into the operand too, which has its batch
        if len(s) > len(m.shape) or any(d not in (1, e) for d, e in zip(reversed(s), reversed(m.shape), strict=False)):
            return None
        into_x = not s or s[-1] == 1  # constant along the product's columns
        into_w = len(s) < 2 or s[-2] == 1  # constant along its rows
    size_x, size_w = (int(np.prod(n.shape)) for n in (x, w))
    if into_x and size_x < size_w:
        return 0
    if into_w and (size_w < size_x or (columns_reduced and scale.op != Op.CONST)):
        return 1
    return None


def _shrinks(op: str, position: int, value: float) -> bool:
    """Is an op with this constant operand a scale of magnitude at most 1?"""
    return (op == Op.MUL and abs(value) <= 1.0) or (op == Op.DIV and position == 1 and abs(value) >= 1.0)


def _signature(s: BlockState, first: int) -> Signature:
    """What the post-loop graphs over a state's accumulators depend on: each accumulator's
    expression, dims (classes renumbered by first appearance, with their sizes and program
    classes) and whether it gathers an unreduced value."""
    renumber: dict[int, int] = {}
    out = []
    for t in s.tiles[first:]:
        dims = []
        for d in t.dims:
            root = s.classes.find(d)
            dims.append(UNIT if root == UNIT else (renumber.setdefault(root, len(renumber)), s.classes.size[root]))
        out.append((t.aid, t.pdims, tuple(dims), t.gathers, t.fid))
    return tuple(out)


def _first_post(s: BlockState) -> int:
    """The index of a state's first accumulator (post-loop tiles follow it)."""
    return next(k for k, t in enumerate(s.tiles) if t.phase == 1)


def _recipe(t: Tile, first: int) -> tuple[Any, ...]:
    return (t.op, tuple(a - first for a in t.args), t.attrs, t.consts)


def _subterm(small: AE, big: AE) -> bool:
    """Is `small` a proper subterm of `big`?"""
    return any(isinstance(k, tuple) and (k == small or _subterm(small, k)) for k in big[1:])


_MISSING = object()


def _reduces(e: AE) -> bool:
    return e[0] in ("sum", "max") or any(isinstance(k, tuple) and _reduces(k) for k in e[1:])


def _unify(cl: Classes | None, x: int, y: int, broadcast: bool) -> Classes | None:
    if cl is None:
        return None
    if x == UNIT and y == UNIT:
        return cl
    if UNIT in (x, y):
        return cl if broadcast else None
    return cl.union(x, y)
