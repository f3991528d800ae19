"""Search time with the in-process executor, 1 Ray worker and 2 Ray workers, in one run.

For one workload (default: rmsnorm_mlp at its published shape, the slowest search that completes,
about 5 s in one process over two depths; qknorm_gqa does not complete within a budget, which
would time the budget): the search
is repeated `--repeat` times per executor and the median reported, with the speedup 1 -> 2
workers, and Ray's fixed costs: starting a local cluster, and the extra time a tiny job takes
through Ray compared with in-process. Each Ray configuration gets a fresh local cluster
(num_cpus = workers), so worker processes start cold every time.

    .venv/bin/python scripts/bench_scaling.py [--workload rmsnorm_mlp] [--repeat 3] [--json out/bench_scaling.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import ray

from superopt import Program, workloads
from superopt.config import SearchConfig
from superopt.search import distributed
from superopt.search.driver import run_search
from superopt.targets import TARGETS


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def tiny() -> Program:
    p = Program("tiny")
    x = p.input("X", (8, 32), "f16")
    p.output(p.exp(x) @ p.input("W", (32, 16), "f16"))
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="rmsnorm_mlp")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=600.0)
    ap.add_argument("--json", default="out/bench_scaling.json")
    args = ap.parse_args()
    h100 = TARGETS["h100"]
    program = workloads.resolve(args.workload)
    config = SearchConfig()
    rows: dict[str, dict[str, object]] = {}

    def record(label: str, runs: list[tuple[float, object]]) -> None:
        secs = [s for s, _ in runs]
        outcome = runs[0][1]
        rows[label] = {
            "median_s": round(statistics.median(secs), 2), "runs_s": [round(s, 2) for s in secs],
            "states": outcome.stats.states, "verified": outcome.stats.verified,
            "best_us": round(outcome.best.best.estimate.time_us, 3),
            "winner": outcome.best.sgraph.dumps(), "budget_exhausted": outcome.stats.budget_exhausted,
        }
        print(f"{label:12s} median {rows[label]['median_s']:7.2f} s  runs {rows[label]['runs_s']}  "
              f"states {outcome.stats.states}  best {rows[label]['best_us']} us", flush=True)

    record("in-process", [timed(lambda: run_search(program, h100, config, budget_s=args.budget_s))
                          for _ in range(args.repeat)])
    init_s: dict[int, float] = {}
    overhead: dict[int, float] = {}
    for workers in (1, 2):
        init_s[workers], _ = timed(lambda w=workers: ray.init(num_cpus=w, include_dashboard=False, log_to_driver=False))
        small = tiny()
        distributed_small = min(
            timed(lambda s=small, w=workers: distributed.run_distributed(s, h100, config, workers=w,
                                                                         address="auto"))[0]
            for _ in range(3)
        )
        local_small = min(timed(lambda s=small: run_search(s, h100, config))[0] for _ in range(3))
        overhead[workers] = distributed_small - local_small
        record(f"ray x{workers}", [
            timed(lambda w=workers: distributed.run_distributed(program, h100, config, budget_s=args.budget_s,
                                                                  workers=w, address="auto"))
            for _ in range(args.repeat)
        ])
        ray.shutdown()
    same = rows["ray x1"]["winner"] == rows["ray x2"]["winner"] == rows["in-process"]["winner"]
    speedup = rows["ray x1"]["median_s"] / rows["ray x2"]["median_s"]  # type: ignore[operator]
    print(f"\nspeedup 1 -> 2 Ray workers: {speedup:.2f}x   same winner everywhere: {same}")
    print("Ray fixed costs: cluster start " + ", ".join(f"{w} cpu {s:.1f} s" for w, s in init_s.items())
          + "; per job (tiny program through Ray minus in-process) "
          + ", ".join(f"x{w} {s:.2f} s" for w, s in overhead.items()))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    for r in rows.values():
        r.pop("winner")
    out.write_text(json.dumps({
        "workload": program.name, "rows": rows, "speedup_1_to_2": round(speedup, 2), "same_winner": same,
        "ray_start_s": init_s, "ray_job_overhead_s": overhead,
    }, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
