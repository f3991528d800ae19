"""scripts/profile_search.py: each shard a search ran, timed, adds up to the search's own counts."""

from __future__ import annotations

from scripts_loader import load_script

from superopt import workloads
from superopt.config import SearchConfig
from superopt.search.driver import run_search
from superopt.targets import TARGETS

profile_search = load_script("profile_search")


def test_shards_add_up_to_the_search() -> None:
    program = workloads.resolve("gated_mlp:ci")
    report = profile_search.profile(program, "h100", 60.0, SearchConfig())
    plain = run_search(program, TARGETS["h100"], SearchConfig(), budget_s=60.0)
    # The same search as run_search's: same winner, same states.
    assert report["complete"] and not plain.stats.budget_exhausted
    assert report["best_us"] == round(plain.best.best.estimate.time_us, 3)
    assert report["states"] == plain.stats.states
    assert report["depth_searched"] == plain.stats.depth
    rows = report["shards"]
    # Every depth searched has its shards, and the per-depth totals are the rows'.
    assert {r["depth"] for r in rows} == set(range(1, plain.stats.depth + 1)) == set(report["depths"])
    for depth, total in report["depths"].items():
        mine = [r for r in rows if r["depth"] == depth]
        assert total["shards"] == len(mine)
        assert total["states"] == sum(r["states"] for r in mine)
        assert total["bounded"] == sum(r["bounded"] for r in mine)
    # The driver's own shards (baseline, split, probe, ties) are not rows: their states are the rest.
    assert 0 < sum(r["states"] for r in rows) <= report["states"]
    assert sum(sum(r["cuts"].values()) for r in rows) == sum(r["bounded"] for r in rows)
    # The one-kernel shard over every input is listed by its inputs' names.
    assert any(r["depth"] == 1 and r["first"] == "graph over (X, W1, W2)" and r["states"] > 0 for r in rows)
    text = profile_search.table(report, top=3)
    assert text.splitlines()[0].startswith("gated_mlp:ci on h100: ")
    assert "| 1 | " in text and text.count("\n| ") >= 3 + 2
