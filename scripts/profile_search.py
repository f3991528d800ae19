"""Where a search's time goes: each shard it ran, with its seconds, states and what the floors cut.

A search is cut into shards (`superopt.search.driver`): per depth (kernel count), one per choice of
first kernel (a library op, or a graph kernel over a set of inputs), from three kernels on once with
a library second kernel and once with a graph-defined one. This runs one search in this process and
prints the slowest shards, the totals per depth and whether the search completed; a search that
does not finish within its budget shows which subtrees hold it (qknorm_gqa at its published shape:
the graph middle kernels after first kernels over Q and K). Shards the driver runs itself (the
baseline, the program split, the probe, settling ties) are not listed, but their states are in the
total, and a shard that the probe interrupted (the one-kernel search, `Driver._tick`) counts the
probe's seconds. Writes JSON.

    .venv/bin/python scripts/profile_search.py qknorm_gqa [--budget-s 60] [--top 15] [--json out/profile.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from superopt.config import SearchConfig
from superopt.loading import load_program
from superopt.program import Program
from superopt.search.driver import Driver, Executor, Shard, ShardResult, rare_full_collections
from superopt.targets import TARGETS


@dataclass
class ShardRow:
    depth: int
    first: str  # the first kernel's choice: a library op, or a graph kernel over these inputs
    middle: str  # the second kernel's kind, from three kernels on ("" below)
    part: str  # "index/parts" of the first kernel's block graphs
    walk: bool  # a walk of loop bodies only (`Driver.walk_loop_bodies`)
    seconds: float
    states: int
    bounded: int  # states the time bound cut
    proved_us: float | None  # the best candidate it proved
    exhausted: bool  # the budget ran out in it
    cuts: dict[str, int] = field(default_factory=dict)  # `bounded`, by the floor that cut them


def describe(program: Program, shard: Shard) -> str:
    kind, what = shard.choice
    if kind == "library":
        _, args, _, op, _ = what
        names = [program.inputs[i].id for i in args]
        return f"library {op}({', '.join(names)})"
    return f"{kind} over ({', '.join(program.inputs[i].id for i in what)})"


def timed(program: Program, run: Executor, rows: list[ShardRow]) -> Executor:
    """`run`, each shard's result recorded with the time from its start to its result."""

    def execute(shards: Iterator[Shard], deadline: float, states_left: int | None) -> Iterable[ShardResult]:
        start = time.monotonic()
        for result in run(shards, deadline, states_left):
            s = result.shard
            proved = min((v.best.estimate.time_us for v in result.verified), default=None)
            rows.append(ShardRow(s.depth, describe(program, s), s.middle or "", f"{s.part[1]}/{s.part[0]}", s.walk,
                                 round(time.monotonic() - start, 3), result.states, result.bounded,
                                 None if proved is None else round(proved, 3), result.exhausted, dict(result.cuts)))
            yield result
            start = time.monotonic()

    return execute


def profile(program: Program, target: str, budget_s: float, config: SearchConfig) -> dict[str, Any]:
    """Run one search with its shards timed: the rows, the totals per depth and the outcome."""
    rows: list[ShardRow] = []
    driver = Driver(program, TARGETS[target], config, budget_s=budget_s, max_states=None, progress=None,
                    executor=None, parts=1, walk_parts=None, stats=None, contenders=1)
    driver.executor = timed(program, driver.in_process, rows)
    old = rare_full_collections()  # as `run_search` does
    t0 = time.monotonic()
    try:
        outcome = driver.run()
    finally:
        gc.set_threshold(*old)
    seconds = time.monotonic() - t0
    stats = outcome.stats
    depths: dict[int, dict[str, float]] = {}
    for r in rows:
        d = depths.setdefault(r.depth, {"shards": 0, "seconds": 0.0, "states": 0, "bounded": 0})
        d["shards"] += 1
        d["seconds"] = round(d["seconds"] + r.seconds, 3)
        d["states"] += r.states
        d["bounded"] += r.bounded
    return {
        "program": program.name, "target": target, "budget_s": budget_s, "seconds": round(seconds, 2),
        "complete": not stats.budget_exhausted, "depth_searched": stats.depth, "states": stats.states,
        "best_us": round(outcome.best.best.estimate.time_us, 3), "best_found_s": stats.best_found_s,
        "bounds": dict(stats.bounds), "depths": depths, "shards": [asdict(r) for r in rows],
    }


def table(report: dict[str, Any], top: int) -> str:
    ending = "deeper ones cut by the bound" if report["complete"] else "then the budget ran out"
    lines = [f"{report['program']} on {report['target']}: {report['seconds']} s, {report['states']:,} states, "
             f"graphs of up to {report['depth_searched']} kernels searched whole, {ending}; "
             f"best {report['best_us']} us found at {report['best_found_s']} s", "",
             "| depth | shards | seconds | states | bounded |", "|---|---|---|---|---|"]
    lines += [f"| {d} | {v['shards']} | {v['seconds']} | {v['states']:,} | {v['bounded']:,} |"
              for d, v in sorted(report["depths"].items())]
    slowest = sorted(report["shards"], key=lambda r: -r["seconds"])[:top]
    lines += ["", f"The {len(slowest)} slowest shards:", "",
              "| depth | first kernel | middle | seconds | states | bounded | proved us | cut most by |",
              "|---|---|---|---|---|---|---|---|"]
    for r in slowest:
        cut = max(r["cuts"].items(), key=lambda kv: kv[1], default=("", 0))
        cut_text = f"{cut[0]} ({cut[1]:,})" if cut[1] else ""
        lines.append(f"| {r['depth']}{' walk' if r['walk'] else ''}{' (stopped)' if r['exhausted'] else ''} | "
                     f"{r['first']} | {r['middle']} | {r['seconds']} | {r['states']:,} | {r['bounded']:,} | "
                     f"{r['proved_us'] if r['proved_us'] is not None else ''} | {cut_text} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("program", help="a built-in workload (name or name:shape) or a program JSON file")
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--target", default="h100", choices=sorted(TARGETS))
    ap.add_argument("--top", type=int, default=15, help="slowest shards listed")
    ap.add_argument("--json", type=Path, default=Path("out/profile_search.json"))
    args = ap.parse_args()
    report = profile(load_program(args.program), args.target, args.budget_s, SearchConfig())
    print(table(report, args.top))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
