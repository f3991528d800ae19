"""The search loop: generate candidates, verify them, instantiate and rank the verified ones.

The search runs depth by depth (kernel count); each depth is cut into shards — the choices of the
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
The same bound, as a time, cuts kernel graphs that cannot be fast enough (`KernelSearch.bound_s`).
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
from typing import Any, ParamSpec, TypeVar

from superopt import costmodel
from superopt.assignments import first_assignment
from superopt.build import unfused_baseline
from superopt.config import SearchConfig
from superopt.program import Program
from superopt.result import SearchStats, Verdict
from superopt.search.block import Body
from superopt.search.instantiation import Ranked, rank
from superopt.search.kernel import MIDDLES, BudgetExhausted, FirstChoice, KernelSearch
from superopt.search.space import space_of
from superopt.search.states import FirstKernel, KState
from superopt.search.views import ProgramViews
from superopt.sgraph import SGraph
from superopt.targets import Target
from superopt.verifier.oracle import Oracle
from superopt.verifier.verify import verify

Progress = Callable[[dict[str, Any]], None]
P = ParamSpec("P")
R = TypeVar("R")
Key = tuple[float, int, str]  # how candidates are ordered: estimated time, kernel count, sGraph text
CONTENDERS = 5  # best candidates a search proves when a GPU will re-time them (else only the best)
PROBE_BLOCK_OPS = 5  # the probe's block graphs (see run_search)
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
    bounds: Counter[str] = field(default_factory=Counter)  # what the time bound cut, by floor (`Floors._cut`)

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
    walk: bool = False  # only walk this part of the first kernel's loop bodies (see run_search)
    bodies: tuple[Body, ...] | None = None  # the first kernel's loop bodies of this part, walked beforehand
    deeper: bool = False  # also return this part's first kernels of deeper graphs (`KernelSearch.first_kernels`)
    firsts: tuple[KState, ...] | None = None  # first kernels dealt out to this shard (instead of its part)
    middle: str | None = None  # from three kernels on: the kind of second kernel (`KernelSearch.candidates_in`)
    settle: tuple[tuple[Key, SGraph], ...] = ()  # tied candidates to prove instead, best first (see run_search)
    # States of this shard during which candidates are held, not proved (what is left of the
    # search's first `HOLD_STATES`): a small search meets a fused candidate, then a faster one,
    # within a hundred states; proving both cost two proofs (a third of rmsnorm_matmul's search).
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

    def __init__(self, program: Program, target: Target, config: SearchConfig,
                 on_state: Callable[[KernelSearch], None] | None = None,
                 on_verified: Callable[[Verified], None] | None = None,
                 decided: dict[str, Verified | str | list[Ranked]] | None = None) -> None:
        self.program, self.target, self.config = program, target, config
        self.on_verified = on_verified  # told of each verified candidate as it is found
        # The search leaves out views at the program's edges; its candidates get them back here.
        self.views = ProgramViews(program)
        searched = self.views.program
        self.search = KernelSearch(searched, space_of(searched), Oracle(searched), config, on_state=on_state,
                                   target=target, views=self.views)
        # candidate text -> its verification, why it was dropped, or its ranking (not verified yet);
        # shared with a probe's searcher (`run_search`): neither depends on the search bounds
        self.decided: dict[str, Verified | str | list[Ranked]] = {} if decided is None else decided
        # keys of candidates proved elsewhere while a shard runs here (by the probe it ran): they
        # tighten its bound at once (`run`)
        self.learned: list[Key] = []

    def forget(self) -> None:
        """Break the reference cycles of a finished search (`KernelSearch.forget`, the callbacks):
        dropped, it is then freed at once by reference counting. A full collection would find it
        too, but walks every live object to do so (0.15-0.25 s after rmsnorm_mlp)."""
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
        states0, pruned0, bounded0, cuts0 = ks.total_states, ks.total_pruned, ks.bounded, Counter(ks.cuts)
        ks.deadline = deadline
        ks.keep = shard.keep
        ks.max_states = None if max_states is None else states0 + max_states
        verified: list[Verified] = []
        rejected: list[tuple[str, str]] = []
        dominated: list[SGraph] = []
        deferred: list[tuple[Key, SGraph]] = []
        best = sorted(shard.contenders)[:shard.keep]

        def bound() -> Key | None:  # the key a candidate must beat: the keep-th best proved
            found = best[shard.keep - 1] if len(best) == shard.keep else None
            ks.bound_s = found[0] if found else float("inf")
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
            # block space may yield none for the rest of the budget (qknorm_gqa:ci's first kernel
            # held its winner from state 300 and proved it only when 8 s were up).
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
            ks.bound_s, ks.on_state = float("inf"), outer
        shard = replace(shard, bodies=None, firsts=None, held=())  # the driver has them: not sent back
        return ShardResult(shard, verified, rejected, ks.total_states - states0, ks.total_pruned - pruned0, exhausted,
                           dominated, deferred, ks.bounded - bounded0, firsts=firsts, held=held, cuts=ks.cuts - cuts0)

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
    has grown by a quarter: rmsnorm_mlp took 7 of them, 0.7 s of 6 s, collecting almost nothing.
    A full collection now waits for 100 collections of the middle generation instead of 10 (the
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
    t0 = time.monotonic()
    stats = stats or SearchStats(symbolic=not config.concrete)
    deadline = time.time() + budget_s if budget_s else float("inf")
    outcome = Outcome([], stats)
    seen: set[str] = set()
    unproved: dict[str, SGraph] = {}  # dominated candidates, in the order they were merged
    tied: dict[str, tuple[Key, SGraph]] = {}  # deferred candidates not settled yet, by text
    pending: list[tuple[Key, SGraph]] = []  # candidates shards held, for the next shard to prove (`Shard.held`)
    last = [0.0]

    live_best = [float("inf")]  # best verified in this process, before its shard is merged

    def report(phase: str, live_states: int = 0, live_pruned: int = 0) -> None:
        stats.seconds = time.monotonic() - t0
        if progress is not None:
            best: float | None = min([v.best.estimate.time_us for v in outcome.verified] + live_best)
            best = None if best == float("inf") else best
            progress({
                "phase": phase, "states": stats.states + live_states, "pruned": stats.pruned + live_pruned,
                "verified": stats.verified, "best_time_us": best, "seconds": round(stats.seconds, 2),
            })

    def tick(ks: KernelSearch) -> None:
        searched = stats.states + ks.total_states - base_states[0]
        if probing and ks is local.search and depth_now[0] == 1 and searched >= PROBE_AFTER_STATES // 4 \
                and searched >= probe_after(ks):
            run_probe = probing.pop()  # decided once: the best only gets faster, deeper graphs no likelier
            if deeper_may_win(2, ks):
                run_probe(1, *live(ks))
                local.learned.extend(best_keys())  # the interrupted shard's bound
        now = time.monotonic()
        if now - last[0] > 0.5:
            last[0] = now
            report("search" if ks is local.search else "probe", *live(ks))

    def live(ks: KernelSearch) -> tuple[int, int]:
        """States and pruned of the running shard (with those of the shard a probe interrupted)."""
        return ks.total_states - base_states[0] + paused[0], ks.total_pruned - base_pruned[0] + paused[1]

    held = [float("inf")]  # the best estimated time held so far

    def hold(v: Verified) -> None:
        """Note when the search first held a candidate as fast as its winner (proved here, or
        merged from a worker's shard); ties found later change nothing a user waits for."""
        if v.sort_key()[0] < held[0]:
            held[0] = v.sort_key()[0]
            stats.best_found_s = round(time.monotonic() - t0, 3)

    def found(v: Verified) -> None:
        hold(v)
        if v.best.estimate.time_us < live_best[0]:
            live_best[0] = v.best.estimate.time_us
            report("found", *live(running[0]))

    base_states, base_pruned = [0], [0]
    local = Searcher(program, target, config, on_state=tick, on_verified=found)
    running = [local.search]  # the kernel search of the shard running in this process
    # The probe while it is still to come (cleared at the end: the probe and the progress callback
    # that runs it refer to each other, a cycle that would keep the whole search alive).
    probing: list[Callable[..., None]] = []
    depth_now = [0]  # the depth being searched
    paused = [0, 0]  # states and pruned of the shard a probe interrupts (not merged yet)

    def merge(result: ShardResult) -> None:
        stats.states += result.states
        stats.pruned += result.pruned
        outcome.rejected.extend(result.rejected)
        stats.rejected += len(result.rejected)
        for v in result.verified:
            text = v.sgraph.dumps()
            if text not in seen:
                seen.add(text)
                outcome.verified.append(v)
                stats.verified += 1
                hold(v)
        for sg in result.dominated:
            text = sg.dumps()
            if text not in unproved:
                unproved[text] = sg
        for key, sg in result.deferred:
            tied.setdefault(key[2], (key, sg))
        pending.extend(result.held)
        stats.budget_exhausted |= result.exhausted
        outcome.bounds.update(result.cuts)

    def holding() -> int:
        """What is left of the search's first `HOLD_STATES` states (the probe's included)."""
        return max(0, HOLD_STATES - stats.states - paused[0])

    def handed() -> tuple[tuple[Key, SGraph], ...]:
        """The candidates held so far, handed to the shard being made (taken from the driver)."""
        out = tuple(pending)
        pending.clear()
        return out

    def unheld() -> None:
        """Candidates still held (no shard came after them) join the ties the driver settles."""
        for key, sg in handed():
            tied.setdefault(key[2], (key, sg))

    def best_keys() -> tuple[Key, ...]:
        return tuple(sorted(v.sort_key() for v in outcome.verified)[:contenders])

    def waiting(faster: bool = False) -> list[tuple[Key, SGraph]]:
        """Deferred candidates that rank ahead of the `contenders`-th best proved, best first;
        `faster`: only those faster than it (not its ties)."""
        proved = sorted(v.sort_key() for v in outcome.verified)
        cut = proved[contenders - 1] if len(proved) >= contenders else None
        return sorted((e for e in tied.values() if e[0][2] not in seen and (
            cut is None or (e[0][0] < cut[0] if faster else e[0] < cut))), key=lambda e: e[0])

    def settle(faster: bool = False) -> None:
        """Verify deferred candidates, best first, until the best `contenders` are all proved.
        Shards defer a candidate that ties the proved one it must beat in time and kernel count
        (it would win only by its text): shards find such ties in an order of their own, and
        proving each tie as found would repeat proofs across shards; one proof here usually does.
        They also defer the candidates held early in a search (`Shard.hold_states`)."""
        base_states[0], base_pruned[0] = local.search.total_states, local.search.total_pruned  # all merged: none live
        while shard := settle_shard(0, faster):
            merge(local.run(shard, deadline, None))

    def settle_shard(depth: int, faster: bool = False) -> Shard | None:
        """The waiting ties, taken out of `tied` (those not reached come back deferred)."""
        entries = waiting(faster)
        if not entries:
            return None
        for key, _ in entries:
            tied.pop(key[2])
        return Shard(depth, ("settle", None), contenders=best_keys(), keep=contenders, settle=tuple(entries))

    unsettled = [False]  # a finished depth's ties are not settled yet

    def settle_shards(depth: int) -> Iterator[Shard]:
        """The finished depth's ties as one shard, for an executor to prove while it runs the next
        depth's first shards (loop-body walks, which no bound changes): shards made meanwhile
        carry a bound that is not settled yet, which only defers more ties (a tie's key is behind
        the one it ties); `settle` at the end proves whatever is still waiting."""
        if unsettled[0] and (shard := settle_shard(depth)):
            yield shard
        unsettled[0] = False

    def split_schedules(searcher: Searcher, states_left: int | None, whole: bool = False) -> list[SGraph]:
        """`KernelSearch.program_split` (`whole`: also of a program that fits one block graph by
        its counts) within the deadline and `states_left`, its candidates with their views."""
        ks = searcher.search
        states, pruned = ks.total_states, ks.total_pruned
        ks.deadline, ks.max_states = deadline, None if states_left is None else states + max(0, states_left)
        try:
            return [searcher.views.unfold(sg) for sg in ks.program_split(whole)]
        except BudgetExhausted:
            return []
        finally:
            stats.states += ks.total_states - states
            stats.pruned += ks.total_pruned - pruned
            stats.budget_exhausted |= time.time() > deadline or (max_states is not None and stats.states >= max_states)

    baseline: list[Verified] = []
    local.consider(unfused_baseline(program), baseline, outcome.rejected)
    merge(ShardResult(Shard(0, ("baseline", None)), baseline, [], 0, 0, False))
    # Before any shard (a concrete search's split tries every concrete tiling of each part,
    # attention_projections' for minutes: within the budgets).
    merge(local.consider_best(split_schedules(local, max_states), contenders))

    def probe(first_depth: int, live_states: int = 0, live_pruned: int = 0) -> None:
        """Anytime, for large searches: once the one-kernel search has reached `probe_after`
        states (from the progress callback, in this process), or `PROBE_AFTER_STATES` (between
        depths, when workers ran it), the program cut into parts (`program_split`, even when it
        fits one block graph by its counts), then the same search with block graphs of at most
        `PROBE_BLOCK_OPS` ops, library ops only
        between the first kernel and the last, for at most `PROBE_STATES` states, from
        `first_depth` kernels on. Its block spaces are small, and winners are often among its
        graphs: the whole one-kernel search walks the post-loop graphs of every small loop body
        (up to 10 ops after a 1-op body) before any larger body, and deeper graphs wait for it.
        qknorm_gqa's winner is held after 6 s (`probe_after`); random programs whose one-kernel
        search outlasts a 15 s budget get a fused kernel (a 5-op chain) or two (a 9-op chain)
        instead of the unfused baseline. What it proves bounds the later shards. A searcher of
        its own: the interrupted one resumes as it was. Its candidates belong to the whole
        search's space; no depth is counted as searched."""
        small = Searcher(program, target, replace(config, max_block_ops=PROBE_BLOCK_OPS), on_state=tick,
                         on_verified=found, decided=local.decided)
        used = stats.states + live_states
        left = PROBE_STATES if max_states is None else min(PROBE_STATES, max_states - used)
        saved = base_states[0], base_pruned[0]
        paused[:] = [live_states, live_pruned]
        try:
            # First the program cut into parts of the whole search's block size (a searcher of
            # that size: a part's own block graph may hold more ops than the part, its norm
            # applied after its products).
            before = stats.states
            wide = Searcher(program, target, config, on_state=tick, on_verified=found, decided=local.decided)
            running[0] = wide.search
            base_states[0], base_pruned[0] = wide.search.total_states, wide.search.total_pruned
            merge(wide.consider_best(split_schedules(wide, left, whole=True), contenders))
            wide.forget()
            left -= stats.states - before
            running[0] = small.search
            for depth in range(first_depth, config.max_kernel_ops + 1):
                if left <= 0 or not deeper_may_win(depth, small.search):
                    return
                for choice in small.search.first_choices(depth):
                    base_states[0], base_pruned[0] = small.search.total_states, small.search.total_pruned
                    result = small.run(Shard(depth, choice, contenders=best_keys(), keep=contenders,
                                             middle="library" if depth >= 3 else None, hold_states=holding(),
                                             held=handed()),
                                       deadline, left)
                    merge(replace(result, exhausted=False))
                    left -= result.states
                    if result.exhausted:
                        stats.budget_exhausted |= time.time() > deadline
                        return
        finally:
            small.forget()
            running[0] = local.search
            base_states[0], base_pruned[0] = saved
            paused[:] = [0, 0]
            if live_states and local.search.max_states is not None:  # the interrupted shard's cap counts them
                local.search.max_states -= stats.states + live_states - used

    if config.max_block_ops > PROBE_BLOCK_OPS and not config.concrete:
        probing.append(probe)
    floor_s = costmodel.floor(program, target).time_s

    def best_s() -> float:
        """The best verified time: merged, or proved by the shard running here."""
        return min([v.best.estimate.time_s for v in outcome.verified] + [live_best[0] * 1e-6])

    def least_s(depth: int, ks: KernelSearch) -> float:
        """Any schedule of `depth` kernels pays that many launches over the program's physical floor."""
        return floor_s + ks.space.launches(depth) * target.launch_overhead_s

    def deeper_may_win(depth: int, ks: KernelSearch) -> bool:
        """Once the best verified schedule is as fast as `least_s`, deeper kernel graphs cannot win."""
        return best_s() > least_s(depth, ks)

    def probe_after(ks: KernelSearch) -> int:
        """One-kernel states before the probe: `PROBE_AFTER_STATES`, or a quarter of that when two
        kernels have much room to win (the best so far takes over `PROBE_ROOM` times their least):
        qknorm_gqa (27.9 us against 4.7) holds its 3-kernel winner after 6 s instead of 11 s;
        rmsnorm_mlp (24.6 against 24.1), whose 17,000-state one-kernel search finds its winner,
        runs no probe."""
        return PROBE_AFTER_STATES // 4 if best_s() > PROBE_ROOM * least_s(2, ks) else PROBE_AFTER_STATES

    def in_process(shards: Iterator[Shard], deadline: float, states_left: int | None) -> Iterator[ShardResult]:
        for shard in shards:
            base_states[0], base_pruned[0] = local.search.total_states, local.search.total_pruned
            yield local.run(shard, deadline, None if max_states is None else max(0, max_states - stats.states))

    run = executor or in_process
    walked: dict[tuple[FirstChoice, int], tuple[Body, ...]] = {}  # first kernels' loop bodies, by choice and part
    # Split into parts, a graph choice's first kernels for deeper graphs are made by the shards that
    # generated its block graphs (by part, `Shard.deeper`), then gathered here and dealt out.
    dealt: dict[FirstChoice, list[KState]] = {}
    local.search.keep = contenders

    def shards_of(depth: int, choice: FirstChoice, middle: str | None) -> Iterator[Shard]:
        """A choice's shards, each made with the best proved when it is taken: its dealt first
        kernels in `parts` shares, or its parts (a library choice splits only when its second
        kernel is the last); from three kernels on, those with a `middle` second kernel."""
        if choice in dealt:
            for i in range(parts):
                if firsts := tuple(dealt[choice][i::parts]):
                    yield Shard(depth, choice, (parts, i), best_keys(), contenders, firsts=firsts, middle=middle,
                                hold_states=holding(), held=handed())
            return
        deeper = parts > 1 and depth < config.max_kernel_ops and choice[0] == "graph" and middle != "graph"
        for i in range(parts if choice[0] == "graph" or depth == 2 else 1):
            yield Shard(depth, choice, (parts, i), best_keys(), contenders, bodies=walked.get((choice, i)),
                        deeper=deeper, middle=middle, hold_states=holding(), held=handed())

    for depth in range(1, config.max_kernel_ops + 1):
        depth_now[0] = depth
        if unsettled[0] and any(key[0] <= least_s(depth, local.search) for key, _ in waiting()):
            unsettled[0] = False
            settle()  # a candidate held or tied may be fast enough to stop the deepening: proved first
        if not deeper_may_win(depth, local.search):
            break
        if depth == 2 and probing and stats.states >= PROBE_AFTER_STATES:
            probing.pop()(2)  # the one-kernel search ran elsewhere (workers), whole: the callback did not see it
            if stats.budget_exhausted or not deeper_may_win(depth, local.search):
                break
        choices = local.search.first_choices(depth)
        if parts > 1 and not config.concrete:
            # Every part of a first kernel's block graphs starts from the same loop bodies: walk
            # them in parts first (once per choice: deeper graphs start the same way), then hand
            # each graph shard those of its part.
            todo = [c for c in choices if c[0] == "graph" and (c, 0) not in walked and c not in dealt]
            found_bodies: dict[FirstChoice, list[Body]] = {c: [] for c in todo}
            walks = walk_parts or parts
            walking = chain(settle_shards(depth), (Shard(depth, c, (walks, i), walk=True) for c in todo
                                                   for i in range(walks)))
            for result in run(walking, deadline, None if max_states is None else max_states - stats.states):
                merge(result)
                if result.shard.walk:
                    found_bodies[result.shard.choice] += result.bodies
            if stats.budget_exhausted:
                break
            for c, bodies in found_bodies.items():  # each graph shard gets the bodies of its part
                for i in range(parts):
                    walked[c, i] = tuple(b for b in bodies if b[1] % parts == i)
        if unsettled[0]:  # no walks ran: settled here
            unsettled[0] = False
            settle()
        # Each shard is made when the executor takes it, with the best proved by then: shards
        # that start later verify less. Split among workers, library first kernels go first: long
        # work should not start last. A library first kernel's shard is split only when the
        # second kernel is the last (its block space is the work; split deeper, the parts would
        # each search the same last kernels again).
        order = sorted(choices, key=lambda c: c[0] == "graph") if parts > 1 else choices
        # From three kernels on, every choice's graphs with a library second kernel come first
        # (a few moves each), then those with a graph-defined one (a block space per first kernel).
        shards = (shard for middle in (MIDDLES if depth >= 3 else (None,))
                  for choice in order for shard in shards_of(depth, choice, middle))
        gathered: dict[FirstChoice, list[tuple[int, list[FirstKernel]]]] = {}
        bounded = False
        for result in run(shards, deadline, None if max_states is None else max_states - stats.states):
            merge(result)
            bounded |= result.bounded > 0
            if result.shard.deeper:
                gathered.setdefault(result.shard.choice, []).append((result.shard.part[1], result.firsts))
            report("verify")
        if stats.budget_exhausted:
            break
        for choice, by_part in gathered.items():  # beaten across parts too, in a fixed order
            union = [f for _, firsts in sorted(by_part, key=lambda p: p[0]) for f in firsts]
            dealt[choice] = [f.state for f in local.search.undominated(union)]
        unheld()
        unsettled[0] = True
        if stats.generic_depth == stats.depth and not bounded:
            stats.generic_depth = depth  # every graph of this many kernels was generated: for any shape
        stats.depth = depth
    # A depth the budget cut short leaves its ties unproved, not the held candidates faster than
    # the best proved: found within the budget, they would have been proved then.
    unheld()
    settle(faster=stats.budget_exhausted and not unsettled[0])
    unproved.update((text, sg) for text, (_, sg) in tied.items() if text not in unproved)
    _keep_contenders(outcome, unproved, contenders)
    local.forget()
    probing.clear()
    stats.seconds = time.monotonic() - t0
    stats.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report("done")
    return outcome


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
    failed = next((layer for layer in v.layers if not layer["passed"]), None)
    return f"{failed['layer']} refuted it" if failed else v.egraph_reason or "not proved"
