"""What a search reports (`SearchStats`): what its time bound cut, and every field documented."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from db_fixtures import standin_result

from superopt import workloads
from superopt.config import SearchConfig
from superopt.core.result import Result, SearchStats
from superopt.search.driver import Searcher, run_search


def test_what_the_time_bound_cut_is_counted_by_floor(h100, monkeypatch):
    """`SearchStats.bounds` sums each shard's cuts by floor: together they are every state the
    bound cut (`ShardResult.bounded`), a part of `pruned`. gated_mlp at its published shape has
    cuts of several floors."""
    bounded: list[int] = []
    run = Searcher.run

    def recording(self, shard, deadline, max_states):
        result = run(self, shard, deadline, max_states)
        bounded.append(result.bounded)
        return result

    monkeypatch.setattr(Searcher, "run", recording)
    stats = run_search(workloads.resolve("gated_mlp"), h100, SearchConfig()).stats
    assert len(stats.bounds) > 1 and all(n > 0 for n in stats.bounds.values())
    assert sum(stats.bounds.values()) == sum(bounded) <= stats.pruned


def test_the_report_carries_the_bounds_and_reads_them_back():
    result = standin_result(workloads.resolve("gated_mlp:ci"))
    result.search.bounds = {"first kernel": 8, "kernels so far": 4}
    report = json.loads(json.dumps(result.to_json()))
    assert report["search"]["bounds"] == {"first kernel": 8, "kernels so far": 4}
    assert Result.from_report(report).search.bounds == result.search.bounds
    del report["search"]["bounds"]  # a report stored before the field
    assert Result.from_report(report).search.bounds == {}


def test_the_report_docs_list_every_search_field():
    """docs/report.md's `search` table names every field a report's `search` holds."""
    page = (Path(__file__).parent.parent / "docs" / "report.md").read_text()
    table = page.split("### `search`", 1)[1].split("\n## ", 1)[0]
    assert [f.name for f in fields(SearchStats) if f"`{f.name}`" not in table] == []
