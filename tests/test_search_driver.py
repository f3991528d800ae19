"""The search driver: budgets, progress, shards in parts, held candidates, settled ties and memory."""

from __future__ import annotations

import gc
import weakref

import pytest

from superopt import workloads
from superopt.build import unfused_baseline
from superopt.config import SearchConfig
from superopt.search.driver import FULL_COLLECTION_AFTER, Searcher, Shard, run_search

pytestmark = pytest.mark.usefixtures("private_cache")


def test_budget_returns_the_best_so_far(h100):
    program = workloads.resolve("gated_mlp:ci")
    outcome = run_search(program, h100, SearchConfig(), max_states=2)
    assert outcome.stats.budget_exhausted
    assert outcome.best.sgraph.name.endswith(".unfused")  # the baseline is verified before searching


def test_progress_reports_each_better_schedule_as_it_is_verified(h100, monkeypatch):
    """The best so far is reported when a candidate is verified, not when its shard ends (a shard
    can run for the whole budget); the report says when the winner was found (`best_found_s`).
    Candidates are proved as they are found here: none is held (`HOLD_STATES`)."""
    from superopt.search import driver

    monkeypatch.setattr(driver, "HOLD_STATES", 0)
    events: list[dict] = []
    outcome = run_search(workloads.resolve("rmsnorm_matmul:ci"), h100, SearchConfig(), progress=events.append)
    found = [e["best_time_us"] for e in events if e["phase"] == "found"]
    assert found == sorted(found, reverse=True) and len(found) >= 2  # the baseline, then better ones
    assert found[-1] == outcome.best.best.estimate.time_us
    last_found = next(e for e in reversed(events) if e["phase"] == "found")
    assert 0 < outcome.stats.best_found_s < outcome.stats.seconds  # when the winner was held, not the end
    assert outcome.stats.best_found_s == pytest.approx(last_found["seconds"], abs=0.02)
    first_merge = next(i for i, e in enumerate(events) if e["phase"] == "verify")
    assert any(e["phase"] == "found" for e in events[1:first_merge])


def test_only_the_contenders_are_proved_and_they_are_the_true_best(h100):
    """Branch and bound on proofs: candidates ranked behind `contenders` proved ones are not
    verified, yet the kept ones are exactly the best of a search that verifies everything."""
    program = workloads.resolve("gated_mlp")  # at its published shape: dozens of candidates
    config = SearchConfig(max_kernel_ops=2)
    everything = run_search(program, h100, config, contenders=10_000)
    assert everything.stats.dominated == 0  # no proof bound, so no time bound either: kept for any shape
    assert everything.stats.generic_depth == everything.stats.depth == 2
    ranked = sorted(everything.verified, key=lambda v: v.sort_key())
    for contenders in (1, 3):
        bounded = run_search(program, h100, config, contenders=contenders)
        assert bounded.stats.verified < everything.stats.verified and bounded.stats.dominated > 0
        fused = [v.sgraph.dumps() for v in sorted(bounded.verified, key=lambda v: v.sort_key())
                 if not v.sgraph.name.endswith(".unfused")]
        assert fused == [v.sgraph.dumps() for v in ranked[:contenders]]
        proved = {v.sgraph.dumps() for v in bounded.verified}
        assert not proved & {sg.dumps() for sg in bounded.dominated}


def test_a_search_in_parts_returns_what_one_walk_does(h100, monkeypatch):
    """The driver walks each first kernel's loop bodies in parts, then gives every graph shard
    those of its part: same verified set and winner as an undivided search. Shards defer the
    candidates that tie their bound but for the text; the driver settles them."""
    from superopt.search import driver

    program = workloads.resolve("rmsnorm_mlp:ci")
    shards: list[driver.Shard] = []
    deferred: list[tuple] = []
    run = driver.Searcher.run

    def recording(self, shard, *args):
        shards.append(shard)
        result = run(self, shard, *args)
        deferred.extend(result.deferred)
        return result

    monkeypatch.setattr(driver.Searcher, "run", recording)
    whole = run_search(program, h100, SearchConfig())
    assert not any(s.walk or s.bodies is not None for s in shards)
    shards.clear()
    split = run_search(program, h100, SearchConfig(), parts=3)
    walks = [s for s in shards if s.walk]
    graphs = [s for s in shards if not s.walk and s.choice[0] == "graph"]
    assert [s.part for s in walks] == [(3, 0), (3, 1), (3, 2)] and all(s.bodies is not None for s in graphs)
    assert sorted(v.sgraph.dumps() for v in split.verified) == sorted(v.sgraph.dumps() for v in whole.verified)
    assert split.best.sgraph.dumps() == whole.best.sgraph.dumps()
    assert deferred and all(key[:2] == split.best.sort_key()[:2] for key, _ in deferred)


def test_a_depths_ties_are_proved_as_a_shard_taken_with_the_next_depths_walks(h100, monkeypatch):
    """Split into parts, the ties a depth deferred go out as one shard, taken just before the
    next depth's loop-body walks (which no bound changes): a parallel executor proves them while
    its workers walk, instead of idling while the driver does. rmsnorm_mlp's winner is such a
    tie: one-kernel schedules as fast as it, ahead of it only by their text (without its norm
    after the products in the program's own block graph, which proves a winner first)."""
    from superopt.search import block

    monkeypatch.setattr(block, "_norms_after_products", lambda program: None)
    program = workloads.resolve("rmsnorm_mlp")  # its search goes on to two kernels
    searcher = Searcher(program, h100, SearchConfig())
    taken: list = []

    def recording(shards, deadline, states_left):
        for shard in shards:
            result = searcher.run(shard, deadline, states_left)
            taken.append((shard, result))
            yield result

    outcome = run_search(program, h100, SearchConfig(), executor=recording, parts=2)
    settling = [n for n, (shard, _) in enumerate(taken) if shard.settle]
    assert len(settling) == 1 and outcome.stats.depth == 2
    shard, result = taken[settling[0]]
    assert shard.depth == 2 and {s.depth for s, _ in taken[: settling[0]]} == {1}
    assert taken[settling[0] + 1][0].walk and taken[settling[0] + 1][0].depth == 2
    assert len(shard.settle) > 1 and [key for key, _ in shard.settle] == sorted(key for key, _ in shard.settle)
    assert [v.sgraph.dumps() for v in result.verified] == [outcome.best.sgraph.dumps()]
    assert outcome.best.verdict.proved


def test_a_settle_shard_proves_ties_best_first_until_enough_are_proved(h100):
    """A settle shard proves its tied candidates in key order: a refuted one is rejected, the
    next is proved, and with `keep` proved the rest go back deferred, unverified."""
    from superopt.mutations import mutants
    from superopt.search.driver import Shard

    program, reference = workloads.reference_for("rmsnorm_matmul:ci")
    wrong = next(sg for why, sg in mutants(reference, program) if why.endswith("square -> exp"))
    unfused = unfused_baseline(program)
    searcher = Searcher(program, h100, SearchConfig())
    ties = ((1.0, 1, "a"), wrong), ((1.0, 1, "b"), reference), ((1.0, 1, "c"), unfused)
    result = searcher.run(Shard(2, ("settle", None), keep=1, settle=ties), float("inf"), None)
    assert [v.sgraph.dumps() for v in result.verified] == [reference.dumps()]
    assert [name for name, _ in result.rejected] == [wrong.name]
    assert [(key, sg.dumps()) for key, sg in result.deferred] == [((1.0, 1, "c"), unfused.dumps())]
    assert result.shard.settle == ()  # not sent back
    # One already proved ahead of them all: nothing to prove.
    ahead = searcher.run(Shard(2, ("settle", None), contenders=((0.5, 1, "z"),), keep=1, settle=ties),
                         float("inf"), None)
    assert not ahead.verified and not ahead.rejected and len(ahead.deferred) == 3


def _proofs_made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the sGraphs the search sends to `verify`, in order."""
    from superopt.search import driver

    names: list[str] = []
    real = driver.verify

    def counting(program, sg, **kwargs):
        names.append(sg.name)
        return real(program, sg, **kwargs)

    monkeypatch.setattr(driver, "verify", counting)
    return names


@pytest.mark.parametrize("hold_states, fused_proofs", [(0, 2), (None, 1)])
def test_candidates_found_early_are_held_and_the_best_proved(h100, monkeypatch, hold_states, fused_proofs):
    """rmsnorm_matmul's one-kernel search meets a fused candidate (the program as one block graph)
    before a faster one. Proved as found, both are proved; held for the search's first
    `HOLD_STATES` (None: the default), only the faster is, when the depth is done. Same winner."""
    from superopt.search import driver

    if hold_states is not None:
        monkeypatch.setattr(driver, "HOLD_STATES", hold_states)
    proofs = _proofs_made(monkeypatch)
    events: list[dict] = []
    outcome = run_search(workloads.resolve("rmsnorm_matmul:ci"), h100, SearchConfig(), progress=events.append)
    assert proofs[0].endswith(".unfused") and len(proofs) == 1 + fused_proofs
    assert outcome.best.verdict.proved and outcome.best.sgraph.name.endswith(".searched")
    assert outcome.best.best.estimate.time_us == pytest.approx(2.609, abs=1e-3)
    # Proved by the driver once the depth is done, the winner is reported with the states searched.
    found = [e["states"] for e in events if e["phase"] == "found"]
    assert found == sorted(found) and found[-1] <= outcome.stats.states


def test_held_candidates_are_proved_once_the_holding_states_are_past(h100):
    """qknorm_gqa:ci holds its winner (2.68 us) from its first 500 states, and its one-kernel
    search then yields no candidate for thousands of states: the held were proved only at the
    next candidate or the end of the depth (8.3 s into an 8 s budget, `best_found_s` and the
    progress line's best lagging all the while). Now they are proved as the states pass."""
    from superopt.search import driver

    events: list[dict] = []
    outcome = run_search(workloads.resolve("qknorm_gqa:ci"), h100, SearchConfig(), max_states=2_000,
                         progress=events.append)
    found = [(e["states"], e["best_time_us"]) for e in events if e["phase"] == "found"]
    assert outcome.stats.budget_exhausted and outcome.best.best.estimate.time_us == pytest.approx(2.679, abs=1e-3)
    assert found[-1][1] == pytest.approx(2.679, abs=1e-3) and found[-1][0] <= driver.HOLD_STATES + 50


def test_held_candidates_are_proved_when_the_budget_runs_out(h100, monkeypatch):
    """A search that runs out of states while its candidates are held still proves the best of
    them: it was found within the budget."""
    from superopt.search import driver

    monkeypatch.setattr(driver, "HOLD_STATES", 10_000)
    proofs = _proofs_made(monkeypatch)
    outcome = run_search(workloads.resolve("rmsnorm_matmul:ci"), h100, SearchConfig(), max_states=40)
    assert outcome.stats.budget_exhausted and outcome.stats.depth == 0
    assert len(proofs) == 2 and outcome.best.sgraph.name.endswith(".searched") and outcome.best.verdict.proved


def test_every_choice_tries_library_middle_kernels_before_graph_ones(h100):
    """From three kernels on, the driver runs every first-kernel choice's shard of graphs with a
    library second kernel before any shard with a graph-defined one (each such shard's work is a
    block space per first kernel, and a budget may end inside one), with the same winner."""
    program = workloads.resolve("gqa:prism-2x8x1x1024x128")  # its winner has three kernels
    searcher = Searcher(program, h100, SearchConfig())
    taken: list[tuple[int, str | None]] = []

    def recording(shards, deadline, states_left):
        for shard in shards:
            taken.append((shard.depth, shard.middle))
            yield searcher.run(shard, deadline, states_left)

    outcome = run_search(program, h100, SearchConfig(), executor=recording)
    deep = [middle for depth, middle in taken if depth == 3]
    assert deep.count("library") >= 2 and deep.count("graph") >= 2
    assert deep == sorted(deep, key=lambda middle: middle != "library")
    assert all(middle is None for depth, middle in taken if depth < 3)
    assert outcome.best.sgraph.dumps() == run_search(program, h100, SearchConfig()).best.sgraph.dumps()


def test_full_collections_are_rare_while_searching_and_as_before_afterwards(h100):
    """A search keeps a large memo of long-lived objects: while it runs, a full garbage collection
    waits for FULL_COLLECTION_AFTER middle-generation ones; the process's thresholds are restored
    when it returns, also when it ends by an error."""
    before = gc.get_threshold()
    during: list[int] = []
    run_search(workloads.resolve("lora:ci"), h100, SearchConfig(),
               progress=lambda _: during.append(gc.get_threshold()[2]))
    assert during and min(during) == max(before[2], FULL_COLLECTION_AFTER) > before[2]
    assert gc.get_threshold() == before

    def fail(_: dict) -> None:
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        run_search(workloads.resolve("lora:ci"), h100, SearchConfig(), progress=fail)
    assert gc.get_threshold() == before


def test_a_finished_search_is_freed_without_a_garbage_collection(h100, monkeypatch):
    """A search's memo is large and cyclic (lazily walked bodies whose generators refer back to
    their generator, progress callbacks): it used to wait for a full collection, which walks every
    live object (0.15-0.25 s per job in a Ray worker). Forgotten at the end of the search, or when
    a worker switches jobs, it is freed by reference counting at once, with no collection."""
    from superopt.search import distributed

    made: list[weakref.ref] = []
    init = Searcher.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    monkeypatch.setattr(Searcher, "__init__", recording)
    program = workloads.resolve("lora:ci")
    thresholds = gc.get_threshold()  # a Ray worker raises them for good
    gc.disable()
    try:
        run_search(program, h100, SearchConfig(), parts=2)
        assert made and all(ref() is None for ref in made)
        made.clear()
        shard = Shard(1, ("graph", (0, 1, 2, 3)), (2, 0), walk=True)
        for job in ("first", "second"):
            distributed._run_shard(job, program.to_json(), h100, SearchConfig(), shard, float("inf"), None, None)
        assert made[0]() is None and made[1]() is distributed._SEARCHERS["second"]
    finally:
        gc.enable()
        gc.set_threshold(*thresholds)
        distributed._SEARCHERS.clear()
