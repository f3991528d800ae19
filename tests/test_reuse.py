"""The shape-reuse store: whole files under concurrent writers, and a miss for another search space."""

from __future__ import annotations

import json
import threading

from superopt import config, workloads
from superopt.config import SearchConfig
from superopt.program import Program
from superopt.search.reuse import SGraphStore
from superopt.sgraph import SGraph


def _stored() -> tuple[Program, list[SGraph]]:
    program, sg = workloads.resolve("rmsnorm_matmul:ci"), workloads.reference_for("rmsnorm_matmul:ci")[1]
    return program, [sg]


def test_concurrent_writers_of_one_key_leave_a_whole_file(tmp_path):
    """Two jobs of one program at two shapes store one key: each write goes through a temporary
    file of its own, so neither fails on the other's rename and a reader never sees a part."""
    store = SGraphStore(tmp_path)
    program, sgraphs = _stored()
    path = store._path(program, SearchConfig())
    failures: list[BaseException] = []
    writing = threading.Event()

    def write(writer: int) -> None:
        try:
            for i in range(150):
                store.save(program, SearchConfig(), sgraphs, {"writer": writer, "i": i, "pad": "x" * (writer * 5000)})
        except Exception as e:
            failures.append(e)

    def read() -> None:
        while writing.is_set():
            try:
                if path.exists():
                    json.loads(path.read_text())
            except Exception as e:
                failures.append(e)
                return

    writers = [threading.Thread(target=write, args=(w,)) for w in (1, 2)]
    writing.set()
    reader = threading.Thread(target=read)
    reader.start()
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    writing.clear()
    reader.join()
    assert failures == []
    assert json.loads(path.read_text())["search"]["i"] == 149
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
    loaded = store.load(program, SearchConfig())
    assert loaded is not None and [(sg.kernels, sg.outputs) for sg in loaded[0]] == [
        (sg.kernels, sg.outputs) for sg in sgraphs]


def test_what_is_reused_is_named_for_the_program_that_asks(tmp_path):
    """A program of another name with the same form at another shape got sGraphs named after the
    program first searched (`gmlp100.searched` for gated_mlp:ci): in a team's cache, one user's
    name shown to another."""
    store = SGraphStore(tmp_path)
    program, sgraphs = _stored()
    store.save(program, SearchConfig(), sgraphs, {})
    other = Program.loads(workloads.resolve("rmsnorm_matmul").dumps().replace('"rmsnorm_matmul"', '"my_norm"'))
    loaded = store.load(other, SearchConfig())
    assert loaded is not None and [sg.name for sg in loaded[0]] == ["my_norm." + sgraphs[0].name.rsplit(".", 1)[1]]


def test_what_another_search_space_stored_is_a_miss(tmp_path, monkeypatch):
    store = SGraphStore(tmp_path)
    program, sgraphs = _stored()
    store.save(program, SearchConfig(), sgraphs, {})
    assert store.load(program, SearchConfig()) is not None
    monkeypatch.setattr(config, "PART_ACCUMULATORS", config.PART_ACCUMULATORS + 1)
    assert store.load(program, SearchConfig()) is None  # a larger space may find better: search again
    monkeypatch.undo()
    assert store.load(program, SearchConfig()) is not None


def test_a_kept_baseline_that_no_longer_proves_is_made_anew(tmp_path, monkeypatch):
    """The kept file of a searched program, its unfused baseline edited (an rms_norm's eps): the
    reuse proved the kept fused schedules but not the baseline, and optimize failed with "not even
    the unfused baseline could be verified". The baseline is now made from the program; the edited
    schedule is refused by its re-proof and never returned."""
    from superopt.api import optimize
    from superopt.build import unfused_baseline

    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))
    program = workloads.resolve("rmsnorm_matmul:ci")
    first = optimize(program, target="h100", cache=False)
    store = SGraphStore()
    sgraphs, stats = store.load(program, SearchConfig())
    assert any(sg.name.endswith(".unfused") for sg in sgraphs)
    forged = [SGraph.loads(sg.dumps().replace('"eps": 1e-06', '"eps": 0.5')) if sg.name.endswith(".unfused") else sg
              for sg in sgraphs]
    assert [sg.dumps() for sg in forged] != [sg.dumps() for sg in sgraphs]
    store.save(program, SearchConfig(), forged, stats)
    again = optimize(program, target="h100", cache=False)
    assert again.search.reused and again.baseline.verdict.proved
    assert again.baseline.sgraph.dumps() == unfused_baseline(program).dumps()
    assert again.best.sgraph.dumps() == first.best.sgraph.dumps() and again.best.verdict.proved
