"""The search loop: generate candidates, verify them, instantiate and rank the verified ones.

A search (`Driver`) runs depth by depth (kernel count); each depth is cut into shards — the choices of the
first kernel, optionally split further into parts of its block graphs (`Shard`) — that an executor
runs: in this process one after another (`run_search`), or as Ray tasks
(`superopt.search.distributed`). Split into parts, a first kernel's loop bodies are walked first,
in parts too, and each graph shard is handed those of its part (every part needs them); the first
kernels of deeper graphs are made by the shards that generated the block graphs of their part,
gathered, cut across parts and dealt out to the deeper shards (so a part's block graphs are
generated once, in whichever process ran that shard). A shard's verified candidates do not depend
on which process ran it, and the merge sorts them by a total order, so any number of workers
returns the same verified set and winner. Between depths the driver decides whether deeper kernel
graphs can still win (launch overhead alone bounds them).

Branch and bound on proofs: verification is most of a search's time, and only the best few
candidates can matter: the winner, or the `contenders` best when a GPU re-times them. A shard
carries the keys of the best candidates verified before its depth began; a candidate that the cost
model ranks behind `contenders` verified ones (those, plus the shard's own) is not verified: it is
kept, unproved, as `dominated` (shape reuse re-verifies what it re-instantiates); one that ties
that bound in time and kernel count is deferred to the driver, which proves the best of them once
the depth is done (`settle`): ties ordered only by text would otherwise be proved once per shard
that meets a smaller one. The result keeps
the best `contenders` proved ones: exactly those a search verifying everything would rank first (a
candidate among them is never behind that many), whatever the shard cut and number of workers.
The same bound, as a time, cuts kernel graphs that cannot be fast enough (`Floors.bound_s`).
Candidates found in a search's first `HOLD_STATES` states are held, ranked, and proved best first
once that many are visited, or by the driver when their depth is done: a small search
(rmsnorm_matmul, lora) meets a fused candidate and then a faster one within a hundred states, and
proves only the faster instead of both.

Anytime: when the time or state budget runs out, the search stops and returns what it has verified
so far (the unfused baseline, verified first, is always among it). Results are deterministic for the
same program and options: ties break by estimated time, then kernel count, then the sGraph's text.
"""

from __future__ import annotations

import functools
import gc
import resource
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import ParamSpec, TypeVar

from superopt import costmodel
from superopt.assignments import first_assignment
from superopt.build import unfused_baseline
from superopt.config import SearchConfig
from superopt.core.progress import Progress
from superopt.core.result import SearchStats, Verdict
from superopt.program import Program
from superopt.search.block import Body, program_forms
from superopt.search.instantiation import Ranked, rank
from superopt.search.kernel import MIDDLES, BudgetExhausted, FirstChoice, KernelSearch
from superopt.search.space import space_of
from superopt.search.states import FirstKernel, KState
from superopt.search.views import ProgramViews
from superopt.sgraph import SGraph
from superopt.targets import Target
from superopt.verifier.oracle import Oracle
from superopt.verifier.verify import verify

P = ParamSpec("P")
R = TypeVar("R")
Key = tuple[float, int, str]  # how candidates are ordered: estimated time, kernel count, sGraph text
CONTENDERS = 5  # best candidates a search proves when a GPU will re-time them (else only the best)
PROBE_BLOCK_OPS = 5  # the probe's block graphs (`Driver.probe`)
PROBE_STATES = 40_000  # the probe's states at most
PROBE_AFTER_STATES = 20_000  # a one-kernel search this large (its block space over every input) calls for a probe
PROBE_ROOM = 2.0  # a best time this many times two kernels' least calls for a probe four times as early
HOLD_STATES = 500  # candidates found in a search's first this many states are held, then proved best first
FULL_COLLECTION_AFTER = 100  # middle-generation collections before a full one, while searching (CPython: 10)


@dataclass
class Verified:
    sgraph: SGraph
    verdict: Verdict
    ranked: list[Ranked]  # best instantiations, best first
    _sort_key: Key | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def best(self) -> Ranked:
        return self.ranked[0]

    def sort_key(self) -> Key:
        """(time, kernels, text): computed once, the driver sorts the proved ones at every shard."""
        if self._sort_key is None:
            self._sort_key = _key(self.sgraph, self.ranked)
        return self._sort_key


@dataclass
class Outcome:
    verified: list[Verified]
    stats: SearchStats
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (sGraph name, why), for reports
    dominated: list[SGraph] = field(default_factory=list)  # not verified: behind CONTENDERS verified ones

    @property
    def best(self) -> Verified:
        return min(self.verified, key=Verified.sort_key)


@dataclass(frozen=True)
class Shard:
    depth: int
    choice: FirstChoice
    part: tuple[int, int] = (1, 0)  # (parts, index) of the first kernel's block graphs
    contenders: tuple[Key, ...] = ()  # the best verified when its depth began (the verification bound)
    keep: int = 1  # how many of the best candidates must be verified
    walk: bool = False  # only walk this part of the first kernel's loop bodies (`Driver.walk_loop_bodies`)
    bodies: tuple[Body, ...] | None = None  # the first kernel's loop bodies of this part, walked beforehand
    deeper: bool = False  # also return this part's first kernels of deeper graphs (`KernelSearch.first_kernels`)
    firsts: tuple[KState, ...] | None = None  # first kernels dealt out to this shard (instead of its part)
    middle: str | None = None  # from three kernels on: the kind of second kernel (`KernelSearch.candidates_in`)
    settle: tuple[tuple[Key, SGraph], ...] = ()  # tied candidates to prove instead, best first (`Driver.settle`)
    # States of this shard during which candidates are held, not proved (what is left of the
    # search's first `HOLD_STATES`): a small search meets a fused candidate, then a faster one,
    # within a hundred states; proving both costs two proofs (a large share of a small search).
    # Held ones, with those that earlier shards held (`held`), are proved best first once the
    # shard has visited that many states (at the next candidate, or its end); else they go back
    # to the driver, which hands them to the next shard. Counted in states, not time, so that a
    # search visits the same states on any machine.
    hold_states: int = 0
    held: tuple[tuple[Key, SGraph], ...] = ()


@dataclass
class ShardResult:
    shard: Shard
    verified: list[Verified]
    rejected: list[tuple[str, str]]
    states: int
    pruned: int
    exhausted: bool
    dominated: list[SGraph] = field(default_factory=list)
    deferred: list[tuple[Key, SGraph]] = field(default_factory=list)  # tied with the bound: see settle
    bounded: int = 0  # kernel-graph states cut by the time bound
    bodies: list[Body] = field(default_factory=list)  # a walk shard's loop bodies
    firsts: list[FirstKernel] = field(default_factory=list)  # a `deeper` shard's first kernels
    held: list[tuple[Key, SGraph]] = field(default_factory=list)  # held, not proved yet (`Shard.hold_states`)
    cuts: Counter[str] = field(default_factory=Counter)  # `bounded`, by the floor that cut them


class Searcher:
    """Everything one job's shards share in a process: the oracle, the kernel search (with its
    memoized block graphs) and the verification of candidates. A Ray worker keeps one per job."""

    search: KernelSearch

    def __init__(self, program: Program, target: Target, config: SearchConfig,
                 on_state: Callable[[KernelSearch], None] | None = None,
                 on_verified: Callable[[Verified], None] | None = None,
                 decided: dict[str, Verified | str | list[Ranked]] | None = None,
                 shared: Searcher | None = None) -> None:
        """`shared`: a searcher of the same program and target (a probe's: `Driver.probe`), whose
        oracle and value paths this one uses, for they depend on neither the bounds of the
        search nor its block size."""
        self.program, self.target, self.config = program, target, config
        self.on_verified = on_verified  # told of each verified candidate as it is found
        # The search leaves out views at the program's edges; its candidates get them back here.
        self.views = ProgramViews(program)
        searched = self.views.program
        # The oracle admits the values of the program's equal forms too (`program_forms`): starting
        # points of the search, each candidate still proved against the program.
        oracle = Oracle(searched, forms=program_forms(searched)) if shared is None else shared.search.oracle
        self.search = KernelSearch(searched, space_of(searched), oracle, config, on_state=on_state,
                                   target=target, views=self.views,
                                   paths=None if shared is None else shared.search.floors.paths)
        # candidate text -> its verification, why it was dropped, or its ranking (not verified yet);
        # shared with a probe's searcher (`Driver.probe`): neither depends on the search bounds
        self.decided: dict[str, Verified | str | list[Ranked]] = {} if decided is None else decided
        # keys of candidates proved elsewhere while a shard runs here (by the probe it ran): they
        # tighten its bound at once (`run`)
        self.learned: list[Key] = []

    def forget(self) -> None:
        """Break the reference cycles of a finished search (`KernelSearch.forget`, the callbacks):
        dropped, it is then freed at once by reference counting. A full collection would find it
        too, but walks every live object to do so, slowly after a large search."""
        self.search.forget()
        self.on_verified = None

    def consider(self, sg: SGraph, verified: list[Verified], rejected: list[tuple[str, str]],
                 dominated: list[SGraph] | None = None, bound: Key | None = None,
                 deferred: list[tuple[Key, SGraph]] | None = None, hold: bool = False) -> None:
        """Rank a candidate's instantiations, then verify it unless it ranks behind `bound` (then it
        goes to `dominated`) or ties it in time and kernel count, ahead only by its text, or `hold`
        says to wait (then it goes to `deferred`, the caller's list of either); a dropped one is
        recorded with why.
        Decisions are remembered: a worker re-running a job's shard does not verify twice."""
        text = sg.dumps()
        decision = self.decided.get(text)
        if decision is None:
            decision = self.decided[text] = self._rank(sg)
        if isinstance(decision, list):
            key = _key(sg, decision)
            if bound is not None and dominated is not None and key > bound:
                dominated.append(sg)
                return
            if deferred is not None and (hold or (bound is not None and key[:2] == bound[:2])):
                deferred.append((key, sg))
                return
            decision = self.decided[text] = self._verify(sg, decision)
        if isinstance(decision, Verified):
            verified.append(decision)
            if self.on_verified is not None:
                self.on_verified(decision)
        else:
            rejected.append((sg.name, decision))

    def consider_best(self, sgraphs: list[SGraph], keep: int) -> ShardResult:
        """`consider` candidates found outside the shards (`KernelSearch.program_split`): the `keep`
        that rank best are verified, the others dominated (proved later only if needed)."""
        ranked: list[tuple[Key, str, SGraph]] = []
        rejected: list[tuple[str, str]] = []
        for sg in sgraphs:
            text = sg.dumps()
            decision = self.decided.get(text)
            if decision is None:
                decision = self.decided[text] = self._rank(sg)
            if isinstance(decision, list):
                ranked.append((_key(sg, decision), text, sg))
            elif isinstance(decision, str):
                rejected.append((sg.name, decision))
        ranked.sort(key=lambda r: r[:2])
        result = ShardResult(Shard(0, ("split", None)), [], rejected, 0, 0, False)
        bound = ranked[keep - 1][0] if len(ranked) >= keep else None
        for _, _, sg in ranked:
            self.consider(sg, result.verified, result.rejected, result.dominated, bound)
        return result

    def _rank(self, sg: SGraph) -> list[Ranked] | str:
        if first_assignment(sg, self.target) is None:
            return "no valid instantiation at the program's shapes"
        return rank(sg, self.target, deadline=self.search.deadline) or "no instantiation ranked"

    def _verify(self, sg: SGraph, ranked: list[Ranked]) -> Verified | str:
        verdict = verify(self.program, sg, target=self.target)
        return Verified(sg, verdict, ranked) if verdict.proved else _why(verdict)

    def run(self, shard: Shard, deadline: float, max_states: int | None) -> ShardResult:
        if shard.settle:
            return self._settle(shard)
        ks = self.search
        states0, pruned0, bounded0, cuts0 = ks.total_states, ks.total_pruned, ks.floors.bounded, Counter(ks.floors.cuts)
        ks.deadline = deadline
        ks.floors.keep = shard.keep
        ks.max_states = None if max_states is None else states0 + max_states
        verified: list[Verified] = []
        rejected: list[tuple[str, str]] = []
        dominated: list[SGraph] = []
        deferred: list[tuple[Key, SGraph]] = []
        best = sorted(shard.contenders)[:shard.keep]

        def bound() -> Key | None:  # the key a candidate must beat: the keep-th best proved
            found = best[shard.keep - 1] if len(best) == shard.keep else None
            ks.floors.bound_s = found[0] if found else float("inf")
            return found

        held = list(shard.held)  # with those found in the shard's first `shard.hold_states` states
        limit: Key | None = None
        learned = len(self.learned)

        def learn() -> None:
            nonlocal best, limit, learned
            if len(self.learned) > learned:
                best = sorted({*best, *self.learned[learned:]})[:shard.keep]
                learned = len(self.learned)
                limit = bound()

        def take(sg: SGraph, hold: bool = False) -> None:
            nonlocal best, limit
            n = len(verified)
            self.consider(sg, verified, rejected, dominated, limit, held if hold else deferred, hold=hold)
            if len(verified) > n:
                best = sorted({*best, verified[-1].sort_key()})[:shard.keep]
                limit = bound()

        def prove_held() -> None:
            for _, sg in sorted(held, key=lambda e: e[0]):
                take(sg)
            held.clear()

        outer = ks.on_state

        def on_state(k: KernelSearch) -> None:
            # Past the holding states the held are proved at once, not at the next candidate: a
            # block space may yield none for the rest of the budget, and a winner held until then
            # would be proved only when the budget is spent.
            if held and k.total_states - states0 >= shard.hold_states:
                prove_held()
            if outer is not None:
                outer(k)
                learn()

        exhausted = False
        try:
            ks.on_state = on_state
            if shard.walk:
                bodies = ks.body_part(shard.choice, shard.part)
                return ShardResult(shard, [], [], ks.total_states - states0, ks.total_pruned - pruned0, False,
                                   bodies=bodies)
            if shard.bodies is not None:
                ks.adopt_bodies(shard.choice, shard.bodies, shard.part)
            limit = bound()
            for cand in ks.candidates_in(shard.depth, shard.choice, shard.part, shard.firsts, shard.middle):
                waiting = ks.total_states - states0 < shard.hold_states
                if held and not waiting:
                    prove_held()
                take(self.views.unfold(cand), hold=waiting)
            if ks.total_states - states0 >= shard.hold_states:
                prove_held()
            # Made here, where this part's block graphs were just generated: elsewhere they would
            # be generated again.
            firsts = ks.first_kernels(shard.choice, shard.part) if shard.deeper else []
        except BudgetExhausted:
            exhausted, firsts = True, []
        finally:
            ks.floors.bound_s, ks.on_state = float("inf"), outer
        shard = replace(shard, bodies=None, firsts=None, held=())  # the driver has them: not sent back
        floors = ks.floors
        return ShardResult(shard, verified, rejected, ks.total_states - states0, ks.total_pruned - pruned0, exhausted,
                           dominated, deferred, floors.bounded - bounded0, firsts=firsts, held=held,
                           cuts=floors.cuts - cuts0)

    def _settle(self, shard: Shard) -> ShardResult:
        """Prove the shard's tied candidates, best first, until `keep` of the best known are proved;
        those not reached go back (`deferred`)."""
        best = sorted(shard.contenders)[:shard.keep]
        verified: list[Verified] = []
        rejected: list[tuple[str, str]] = []
        left = list(shard.settle)
        while left and not (len(best) == shard.keep and left[0][0] >= best[-1]):
            key, sg = left.pop(0)
            n = len(verified)
            self.consider(sg, verified, rejected)
            if len(verified) > n:
                best = sorted([*best, key])[:shard.keep]
        return ShardResult(replace(shard, settle=()), verified, rejected, 0, 0, False, deferred=left)


def rare_full_collections() -> tuple[int, int, int]:
    """A search keeps millions of long-lived objects (memoized block graphs and states) and makes
    little cyclic garbage, yet CPython walks every object in a full collection each time the heap
    has grown by a quarter, spending a noticeable share of a search collecting almost nothing.
    A full collection waits for `FULL_COLLECTION_AFTER` collections of the middle generation (the
    young ones, which catch short-lived cycles, are unchanged). Returns the old thresholds."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, max(old, FULL_COLLECTION_AFTER))
    return young, middle, old


def _rare_full_collections_during(search: Callable[P, R]) -> Callable[P, R]:
    """`rare_full_collections` for the length of a search in this process (restored at its end,
    not after each shard: a full collection put off would then run at once)."""

    @functools.wraps(search)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        old = rare_full_collections()
        try:
            return search(*args, **kwargs)
        finally:
            gc.set_threshold(*old)

    return wrapped


# An executor runs a depth's shards and yields their results (in any order). It takes each shard
# from the iterator only when it can start it: a shard is made with what the results merged so far
# have proved.
Executor = Callable[[Iterator[Shard], float, "int | None"], Iterable[ShardResult]]


@_rare_full_collections_during
def run_search(
    program: Program, target: Target, config: SearchConfig, *, budget_s: float | None = None,
    max_states: int | None = None, progress: Progress | None = None, executor: Executor | None = None,
    parts: int = 1, walk_parts: int | None = None, stats: SearchStats | None = None, contenders: int = 1,
) -> Outcome:
    """Search depth by depth; `executor` runs each depth's shards (default: in this process),
    `parts` splits every shard's first block space that many ways (for more, smaller shards),
    `walk_parts` (default `parts`) the walk of its loop bodies, `contenders` best candidates are
    verified (the others only as far as they rank ahead)."""
    return Driver(program, target, config, budget_s=budget_s, max_states=max_states, progress=progress,
                  executor=executor, parts=parts, walk_parts=walk_parts, stats=stats, contenders=contenders).run()


# First kernels of deeper graphs that a depth's `deeper` shards made, by choice: (part index, first kernels)
Gathered = dict[FirstChoice, list[tuple[int, list[FirstKernel]]]]


class Driver:
    """One search (`run_search`), its phases as methods that `run` calls in order: the baseline,
    the program split, then each depth (`search_depth`: the probe when workers ran the one-kernel
    search, the loop-body walks, the settling of the last depth's ties, the depth's shards), and
    `finish` (what is still held or tied, settled; the contenders kept).

    One step is not in that order: the probe that interrupts the one-kernel shard running in this
    process starts from that shard's state callback (`_tick`). It must: that shard may outlast the
    budget, and what the probe proves bounds the rest of it at once (`Searcher.learned`)."""

    def __init__(
        self, program: Program, target: Target, config: SearchConfig, *, budget_s: float | None,
        max_states: int | None, progress: Progress | None, executor: Executor | None, parts: int,
        walk_parts: int | None, stats: SearchStats | None, contenders: int,
    ) -> None:
        self.program, self.target, self.config = program, target, config
        self.max_states, self.progress, self.executor = max_states, progress, executor
        self.parts, self.walk_parts, self.contenders = parts, walk_parts or parts, contenders
        self.t0 = time.monotonic()
        self.stats = stats or SearchStats(symbolic=not config.concrete)
        self.deadline = time.time() + budget_s if budget_s else float("inf")
        self.outcome = Outcome([], self.stats)
        self.seen: set[str] = set()  # texts of the verified candidates merged
        self.unproved: dict[str, SGraph] = {}  # dominated candidates, in the order they were merged
        self.tied: dict[str, tuple[Key, SGraph]] = {}  # deferred candidates not settled yet, by text
        self.pending: list[tuple[Key, SGraph]] = []  # candidates shards held, for the next shard (`Shard.held`)
        self.reported = 0.0  # when progress was last reported
        self.live_best_us = float("inf")  # best verified in this process, before its shard is merged
        self.held_s = float("inf")  # the best estimated time held so far
        self.local = Searcher(program, target, config, on_state=self._tick, on_verified=self._found)
        self.running = self.local.search  # the kernel search of the shard running in this process
        self.base_states = self.base_pruned = 0  # its counts when that shard began
        self.paused_states = self.paused_pruned = 0  # of the shard a probe interrupts (not merged yet)
        self.probe_pending = config.max_block_ops > PROBE_BLOCK_OPS and not config.concrete
        self.one_kernel_slower: bool | None = None  # `paths_favour_deeper`, once asked
        self.depth = 0  # the depth being searched
        self.unsettled = False  # a finished depth's ties are not settled yet
        self.floor_s = costmodel.floor(program, target).time_s
        self.walked: dict[tuple[FirstChoice, int], tuple[Body, ...]] = {}  # first kernels' loop bodies, by part
        # Split into parts, a graph choice's first kernels for deeper graphs are made by the shards that
        # generated its block graphs (by part, `Shard.deeper`), then gathered here and dealt out.
        self.dealt: dict[FirstChoice, list[KState]] = {}

    def run(self) -> Outcome:
        self.prove_baseline()
        self.split()
        self.local.search.floors.keep = self.contenders  # first kernels dealt out (`deal`) are beaten by this many
        for depth in range(1, self.config.max_kernel_ops + 1):
            if not self.search_depth(depth):
                break
        self.finish()
        return self.outcome

    # -- the phases, in the order `run` calls them ------------------------------------------------
    def prove_baseline(self) -> None:
        """The unfused baseline, verified first: whatever the budget, the search returns it."""
        baseline: list[Verified] = []
        self.local.consider(unfused_baseline(self.program), baseline, self.outcome.rejected)
        self.merge(ShardResult(Shard(0, ("baseline", None)), baseline, [], 0, 0, False))

    def split(self) -> None:
        """The program cut into parts that each fit a kernel, before any shard (a concrete search's
        split tries every concrete tiling of each part, attention_projections' for minutes: within
        the budgets). What it proves bounds every shard."""
        self.merge(self.local.consider_best(self.split_schedules(self.local, self.max_states), self.contenders))

    def search_depth(self, depth: int) -> bool:
        """Every kernel graph of `depth` kernels; False when the search stops instead (deeper graphs
        cannot win, or the budget ran out)."""
        self.depth = depth
        ks = self.local.search
        if self.unsettled and any(key[0] <= self.least_s(depth, ks) for key, _ in self.waiting()):
            self.settle()  # a candidate held or tied may be fast enough to stop the deepening: proved first
        if not self.deeper_may_win(depth, ks):
            return False
        if depth == 2 and self.probe_pending and self.stats.states >= PROBE_AFTER_STATES:
            self.probe_pending = False  # the one-kernel search ran elsewhere (workers), whole: `_tick` did not see it
            self.probe(2)
            if self.stats.budget_exhausted or not self.deeper_may_win(depth, ks):
                return False
        choices = ks.first_choices(depth)
        if self.parts > 1 and not self.config.concrete:
            self.walk_loop_bodies(depth, choices)
            if self.stats.budget_exhausted:
                return False
        if self.unsettled:  # no walks ran: settled here
            self.settle()
        gathered, bounded = self.run_shards(depth, choices)
        if self.stats.budget_exhausted:
            return False
        self.deal(gathered)
        self.unheld()
        self.unsettled = True
        if self.stats.generic_depth == self.stats.depth and not bounded:
            self.stats.generic_depth = depth  # every graph of this many kernels was generated: for any shape
        self.stats.depth = depth
        return True

    def walk_loop_bodies(self, depth: int, choices: list[FirstChoice]) -> None:
        """Every part of a first kernel's block graphs starts from the same loop bodies: walk them
        in parts first (once per choice: deeper graphs start the same way), with the last depth's
        ties (`settle_shards`), then keep those of each part for its graph shard (`shards_of`)."""
        todo = [c for c in choices if c[0] == "graph" and (c, 0) not in self.walked and c not in self.dealt]
        found: dict[FirstChoice, list[Body]] = {c: [] for c in todo}
        walks = self.walk_parts
        walking = chain(self.settle_shards(depth), (Shard(depth, c, (walks, i), walk=True) for c in todo
                                                    for i in range(walks)))
        for result in self.execute(walking):
            self.merge(result)
            if result.shard.walk:
                found[result.shard.choice] += result.bodies
        if self.stats.budget_exhausted:
            return
        for c, bodies in found.items():
            for i in range(self.parts):
                self.walked[c, i] = tuple(b for b in bodies if b[1] % self.parts == i)

    def run_shards(self, depth: int, choices: list[FirstChoice]) -> tuple[Gathered, bool]:
        """The depth's shards, each made when the executor takes it, with the best proved by then:
        shards that start later verify less. Split among workers, library first kernels go first:
        long work should not start last. From three kernels on, every choice's graphs with a
        library second kernel come first (a few moves each), then those with a graph-defined one
        (a block space per first kernel). Returns the first kernels of deeper graphs the shards
        made, and whether the time bound cut any state."""
        order = sorted(choices, key=lambda c: c[0] == "graph") if self.parts > 1 else choices
        shards = (shard for middle in (MIDDLES if depth >= 3 else (None,))
                  for choice in order for shard in self.shards_of(depth, choice, middle))
        gathered: Gathered = {}
        bounded = False
        for result in self.execute(shards):
            self.merge(result)
            bounded |= result.bounded > 0
            if result.shard.deeper:
                gathered.setdefault(result.shard.choice, []).append((result.shard.part[1], result.firsts))
            self.report("verify")
        return gathered, bounded

    def deal(self, gathered: Gathered) -> None:
        """The first kernels of deeper graphs made in parts, beaten across parts too (in a fixed
        order), to be dealt out to the next depth's shards (`shards_of`)."""
        for choice, by_part in gathered.items():
            union = [f for _, firsts in sorted(by_part, key=lambda p: p[0]) for f in firsts]
            self.dealt[choice] = [f.state for f in self.local.search.floors.undominated(union)]

    def finish(self) -> None:
        """The candidates still held or tied, settled, and the result's contenders kept. A depth the
        budget cut short leaves its ties unproved, not the held candidates faster than the best
        proved: found within the budget, they would have been proved then."""
        self.unheld()
        self.settle(faster=self.stats.budget_exhausted and not self.unsettled)
        self.unproved.update((text, sg) for text, (_, sg) in self.tied.items() if text not in self.unproved)
        _keep_contenders(self.outcome, self.unproved, self.contenders)
        self.local.forget()  # its callbacks are this driver's methods: a cycle, broken
        self.stats.seconds = time.monotonic() - self.t0
        self.stats.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        self.report("done")

    # -- shards ---------------------------------------------------------------------------------
    def execute(self, shards: Iterator[Shard]) -> Iterable[ShardResult]:
        """The shards run by the executor (default: `in_process`), within the states left."""
        run = self.executor or self.in_process
        return run(shards, self.deadline, None if self.max_states is None else self.max_states - self.stats.states)

    def in_process(self, shards: Iterator[Shard], deadline: float, states_left: int | None) -> Iterator[ShardResult]:
        """The default executor: each shard in this process, within the states left when it starts."""
        for shard in shards:
            self.begin(self.local.search)
            yield self.local.run(shard, deadline, None if self.max_states is None
                                 else max(0, self.max_states - self.stats.states))

    def begin(self, ks: KernelSearch) -> None:
        """A shard starts in this process on `ks`: what it counted before is merged already."""
        self.base_states, self.base_pruned = ks.total_states, ks.total_pruned

    def shards_of(self, depth: int, choice: FirstChoice, middle: str | None) -> Iterator[Shard]:
        """A choice's shards, each made with the best proved when it is taken: its dealt first
        kernels in `parts` shares, or its parts (a library choice splits only when its second
        kernel is the last: split deeper, the parts would each search the same last kernels
        again); from three kernels on, those with a `middle` second kernel."""
        parts = self.parts
        if choice in self.dealt:
            for i in range(parts):
                if firsts := tuple(self.dealt[choice][i::parts]):
                    yield Shard(depth, choice, (parts, i), self.best_keys(), self.contenders, firsts=firsts,
                                middle=middle, hold_states=self.holding(), held=self.handed())
            return
        deeper = parts > 1 and depth < self.config.max_kernel_ops and choice[0] == "graph" and middle != "graph"
        for i in range(parts if choice[0] == "graph" or depth == 2 else 1):
            yield Shard(depth, choice, (parts, i), self.best_keys(), self.contenders,
                        bodies=self.walked.get((choice, i)), deeper=deeper, middle=middle,
                        hold_states=self.holding(), held=self.handed())

    def merge(self, result: ShardResult) -> None:
        stats = self.stats
        stats.states += result.states
        stats.pruned += result.pruned
        self.outcome.rejected.extend(result.rejected)
        stats.rejected += len(result.rejected)
        for v in result.verified:
            text = v.sgraph.dumps()
            if text not in self.seen:
                self.seen.add(text)
                self.outcome.verified.append(v)
                stats.verified += 1
                self.note_held(v)
        for sg in result.dominated:
            self.unproved.setdefault(sg.dumps(), sg)
        for key, sg in result.deferred:
            self.tied.setdefault(key[2], (key, sg))
        self.pending.extend(result.held)
        stats.budget_exhausted |= result.exhausted
        for floor, cut in result.cuts.items():
            stats.bounds[floor] = stats.bounds.get(floor, 0) + cut

    def best_keys(self) -> tuple[Key, ...]:
        return tuple(sorted(v.sort_key() for v in self.outcome.verified)[:self.contenders])

    def split_schedules(self, searcher: Searcher, states_left: int | None, whole: bool = False) -> list[SGraph]:
        """`KernelSearch.program_split` (`whole`: also of a program that fits one block graph by
        its counts) within the deadline and `states_left`, its candidates with their views."""
        ks, stats = searcher.search, self.stats
        states, pruned = ks.total_states, ks.total_pruned
        ks.deadline, ks.max_states = self.deadline, None if states_left is None else states + max(0, states_left)
        try:
            return [searcher.views.unfold(sg) for sg in ks.program_split(whole)]
        except BudgetExhausted:
            return []
        finally:
            stats.states += ks.total_states - states
            stats.pruned += ks.total_pruned - pruned
            stats.budget_exhausted |= time.time() > self.deadline or (
                self.max_states is not None and stats.states >= self.max_states)

    # -- held candidates (`Shard.hold_states`) ----------------------------------------------------
    def holding(self) -> int:
        """What is left of the search's first `HOLD_STATES` states (the probe's included)."""
        return max(0, HOLD_STATES - self.stats.states - self.paused_states)

    def handed(self) -> tuple[tuple[Key, SGraph], ...]:
        """The candidates held so far, handed to the shard being made (taken from the driver)."""
        out = tuple(self.pending)
        self.pending.clear()
        return out

    def unheld(self) -> None:
        """Candidates still held (no shard came after them) join the ties the driver settles."""
        for key, sg in self.handed():
            self.tied.setdefault(key[2], (key, sg))

    def note_held(self, v: Verified) -> None:
        """Note when the search first held a candidate as fast as its winner (proved here, or
        merged from a worker's shard); ties found later change nothing a user waits for."""
        if v.sort_key()[0] < self.held_s:
            self.held_s = v.sort_key()[0]
            self.stats.best_found_s = round(time.monotonic() - self.t0, 3)

    # -- settling ties ----------------------------------------------------------------------------
    def waiting(self, faster: bool = False) -> list[tuple[Key, SGraph]]:
        """Deferred candidates that rank ahead of the `contenders`-th best proved, best first;
        `faster`: only those faster than it (not its ties)."""
        proved = sorted(v.sort_key() for v in self.outcome.verified)
        cut = proved[self.contenders - 1] if len(proved) >= self.contenders else None
        return sorted((e for e in self.tied.values() if e[0][2] not in self.seen and (
            cut is None or (e[0][0] < cut[0] if faster else e[0] < cut))), key=lambda e: e[0])

    def settle(self, faster: bool = False) -> None:
        """Verify deferred candidates, best first, until the best `contenders` are all proved.
        Shards defer a candidate that ties the proved one it must beat in time and kernel count
        (it would win only by its text): shards find such ties in an order of their own, and
        proving each tie as found would repeat proofs across shards; one proof here usually does.
        They also defer the candidates held early in a search (`Shard.hold_states`)."""
        self.unsettled = False
        self.begin(self.local.search)  # all merged: none live
        while shard := self.settle_shard(0, faster):
            self.merge(self.local.run(shard, self.deadline, None))

    def settle_shard(self, depth: int, faster: bool = False) -> Shard | None:
        """The waiting ties, taken out of `tied` (those not reached come back deferred)."""
        entries = self.waiting(faster)
        if not entries:
            return None
        for key, _ in entries:
            self.tied.pop(key[2])
        return Shard(depth, ("settle", None), contenders=self.best_keys(), keep=self.contenders,
                     settle=tuple(entries))

    def settle_shards(self, depth: int) -> Iterator[Shard]:
        """The finished depth's ties as one shard, for an executor to prove while it runs the next
        depth's first shards (loop-body walks, which no bound changes): shards made meanwhile
        carry a bound that is not settled yet, which only defers more ties (a tie's key is behind
        the one it ties); `finish` proves whatever is still waiting."""
        if self.unsettled and (shard := self.settle_shard(depth)):
            yield shard
        self.unsettled = False

    # -- the bound on depth -----------------------------------------------------------------------
    def best_s(self) -> float:
        """The best verified time: merged, or proved by the shard running here."""
        return min([v.best.estimate.time_s for v in self.outcome.verified] + [self.live_best_us * 1e-6])

    def least_s(self, depth: int, ks: KernelSearch) -> float:
        """Any schedule of `depth` kernels pays that many launches over the program's physical floor."""
        return self.floor_s + ks.space.launches(depth) * self.target.launch_overhead_s

    def deeper_may_win(self, depth: int, ks: KernelSearch) -> bool:
        """Once the best verified schedule is as fast as `least_s`, deeper kernel graphs cannot win."""
        return self.best_s() > self.least_s(depth, ks)

    # -- the probe --------------------------------------------------------------------------------
    def probe_after(self, ks: KernelSearch) -> int:
        """One-kernel states before the probe: `PROBE_AFTER_STATES`, or a quarter of that when two
        kernels have much room to win (the best so far takes over `PROBE_ROOM` times their least):
        a program whose winner takes several kernels is probed, and reaches it, sooner; one whose
        best so far is already near two kernels' least keeps its one-kernel search longer, which
        is where such a winner is found."""
        return PROBE_AFTER_STATES // 4 if self.best_s() > PROBE_ROOM * self.least_s(2, ks) else PROBE_AFTER_STATES

    def probe_due(self, ks: KernelSearch) -> bool:
        """Whether the one-kernel shard running here on `ks` has searched enough states to be
        interrupted by the probe: at once where one kernel is slower than deeper graphs may be."""
        if not (self.probe_pending and ks is self.local.search and self.depth == 1):
            return False
        if self.one_kernel_slower is None:
            self.one_kernel_slower = self.paths_favour_deeper(ks)
        searched = self.stats.states + ks.total_states - self.base_states
        return self.one_kernel_slower or (searched >= PROBE_AFTER_STATES // 4 and searched >= self.probe_after(ks))

    def paths_favour_deeper(self, ks: KernelSearch) -> bool:
        """Do the kernels as paths over program values (`Floors.paths_floor`) show one kernel
        slower than some deeper graph may be? (qknorm_gqa: one kernel re-reads K for the row sums
        of its softmax, 23.0 us at least, three kernels 12.6.) Then no one-kernel state comes
        before the probe, which searches deeper graphs."""
        floors, root = ks.floors, ks.initial()
        if floors.paths is None or floors.bound_s == float("inf"):
            return False
        one = floors.paths_floor(root, 1)
        return any(floors.paths_floor(root, k) < one for k in range(2, self.config.max_kernel_ops + 1))

    def probe(self, first_depth: int, live_states: int = 0, live_pruned: int = 0) -> None:
        """Anytime, for large searches: once the one-kernel search has reached `probe_after`
        states (interrupting its shard, `_tick`), or `PROBE_AFTER_STATES` (between depths, when
        workers ran it), the program cut into parts (`program_split`, even when it fits one block
        graph by its counts), then the same search with block graphs of at most `PROBE_BLOCK_OPS`
        ops, library ops only between the first kernel and the last, for at most `PROBE_STATES`
        states, from `first_depth` kernels on. Its block spaces are small, and winners are often
        among its graphs: the whole one-kernel search walks the post-loop graphs of every small
        loop body (up to 10 ops after a 1-op body) before any larger body, and deeper graphs wait
        for it, so a program whose one-kernel search outlasts a short budget still gets fused
        kernels from the probe rather than the unfused baseline. What it proves bounds the later
        shards. Searchers
        of its own: the interrupted one resumes as it was (`live_states` and `live_pruned` are its
        shard's, not merged yet). Its candidates belong to the whole search's space; no depth is
        counted as searched."""
        program, target, config, stats = self.program, self.target, self.config, self.stats
        small = Searcher(program, target, replace(config, max_block_ops=PROBE_BLOCK_OPS), on_state=self._tick,
                         on_verified=self._found, decided=self.local.decided, shared=self.local)
        used = stats.states + live_states
        left = PROBE_STATES if self.max_states is None else min(PROBE_STATES, self.max_states - used)
        saved = self.base_states, self.base_pruned
        self.paused_states, self.paused_pruned = live_states, live_pruned
        try:
            # First the program cut into parts of the whole search's block size (a searcher of
            # that size: a part's own block graph may hold more ops than the part, its norm
            # applied after its products).
            before = stats.states
            wide = Searcher(program, target, config, on_state=self._tick, on_verified=self._found,
                            decided=self.local.decided, shared=self.local)
            self.running = wide.search
            self.begin(wide.search)
            self.merge(wide.consider_best(self.split_schedules(wide, left, whole=True), self.contenders))
            wide.forget()
            left -= stats.states - before
            self.running = small.search
            for depth in range(first_depth, config.max_kernel_ops + 1):
                if left <= 0 or not self.deeper_may_win(depth, small.search):
                    return
                for choice in small.search.first_choices(depth):
                    self.begin(small.search)
                    result = small.run(Shard(depth, choice, contenders=self.best_keys(), keep=self.contenders,
                                             middle="library" if depth >= 3 else None, hold_states=self.holding(),
                                             held=self.handed()),
                                       self.deadline, left)
                    self.merge(replace(result, exhausted=False))
                    left -= result.states
                    if result.exhausted:
                        stats.budget_exhausted |= time.time() > self.deadline
                        return
        finally:
            small.forget()
            self.running = self.local.search
            self.base_states, self.base_pruned = saved
            self.paused_states = self.paused_pruned = 0
            if live_states and self.local.search.max_states is not None:  # the interrupted shard's cap counts them
                self.local.search.max_states -= stats.states + live_states - used

    # -- the kernel searches' callbacks, in this process --------------------------------------------
    def _tick(self, ks: KernelSearch) -> None:
        """At each state of a kernel search running here: the probe once it is due (within the
        one-kernel shard, which then resumes bounded by what the probe proved), and progress
        twice a second."""
        if self.probe_due(ks):
            self.probe_pending = False  # decided once: the best only gets faster, deeper graphs no likelier
            if self.deeper_may_win(2, ks):
                self.probe(1, *self.live(ks))
                self.local.learned.extend(self.best_keys())  # the interrupted shard's bound
        now = time.monotonic()
        if now - self.reported > 0.5:
            self.reported = now
            self.report("search" if ks is self.local.search else "probe", *self.live(ks))

    def _found(self, v: Verified) -> None:
        """A candidate verified here, before its shard is merged: progress shows it at once."""
        self.note_held(v)
        if v.best.estimate.time_us < self.live_best_us:
            self.live_best_us = v.best.estimate.time_us
            self.report("found", *self.live(self.running))

    def live(self, ks: KernelSearch) -> tuple[int, int]:
        """States and pruned of the running shard (with those of the shard a probe interrupted)."""
        return (ks.total_states - self.base_states + self.paused_states,
                ks.total_pruned - self.base_pruned + self.paused_pruned)

    def report(self, phase: str, live_states: int = 0, live_pruned: int = 0) -> None:
        stats = self.stats
        stats.seconds = time.monotonic() - self.t0
        if self.progress is not None:
            best = min([v.best.estimate.time_us for v in self.outcome.verified] + [self.live_best_us])
            self.progress({
                "phase": phase, "states": stats.states + live_states, "pruned": stats.pruned + live_pruned,
                "verified": stats.verified, "best_time_us": None if best == float("inf") else best,
                "depth": self.depth or None, "seconds": round(stats.seconds, 2),
            })


def _keep_contenders(outcome: Outcome, unproved: dict[str, SGraph], contenders: int) -> None:
    """The result keeps the best `contenders` verified candidates and the unfused baseline; what
    else was proved joins the dominated ones. Which candidates a shard proves beyond the best
    depends on how the search was cut into shards; the best `contenders` do not, so neither does
    the result."""
    ordered = sorted(outcome.verified, key=Verified.sort_key)
    proved = {v.sgraph.dumps() for v in ordered}
    outcome.verified = [v for n, v in enumerate(ordered) if n < contenders or v.sgraph.name.endswith(".unfused")]
    kept = {id(v) for v in outcome.verified}
    outcome.dominated = [v.sgraph for v in ordered if id(v) not in kept]
    outcome.dominated += [sg for text, sg in unproved.items() if text not in proved]
    outcome.stats.dominated = len(outcome.dominated)


def _key(sg: SGraph, ranked: list[Ranked]) -> Key:
    return (ranked[0].estimate.time_s, len(sg.kernels), sg.dumps())


def _why(v: Verdict) -> str:
    """Why a candidate was not proved: a numeric layer refutes it (a mismatch); the e-graph only
    stops short of a proof (at a limit, or saturated); no instantiation says so itself."""
    failed = next((layer for layer in v.layers if not layer["passed"]), None)
    if failed is None:
        return v.egraph_reason or "not proved"
    if failed["layer"] == "egraph":
        return f"egraph did not prove it ({failed['detail']['reason']})"
    return failed["detail"] if isinstance(failed["detail"], str) else f"{failed['layer']} refuted it"
