"""Symbolic and concrete search for every built-in workload, side by side, with the anchors.

Each search runs in a fresh subprocess (so its peak memory is its own), at the workload's default
published shape, in-process, on the h100 cost model. Printed: a markdown table (seconds, states,
pruned, verified, best estimated time and when the search first held it, the hand-written reference
sGraph's best time, speedup over the unfused baseline, DRAM bytes over the physical floor, peak
memory) and, for the workloads Mirage and Prism were measured on here, their
figures at the same shapes (../shared/research/peer_measurements.md: Mirage's concrete search
and Prism's symbolic search on a machine like this one). Writes JSON.

    .venv/bin/python scripts/bench_search.py [--budget-s 300] [--workloads gqa,lora] [--json out/bench_search.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from superopt import workloads

# Measured with Mirage's own code (main @ ffe38dff) on a 2-core machine: (states, graphs, seconds, memory).
ANCHORS = {
    "rmsnorm_matmul": {"spec": "rmsnorm_matmul", "mirage": (19701, 26, 1.41, "43 MiB"),
                       "prism": (657, 9, 0.34, "12 MiB")},
    "gated_mlp": {"spec": "gated_mlp", "mirage": (515884, 11, 50.0, "1.1 GiB"), "prism": (4415, 12, 1.70, "32 MiB")},
    "gqa": {"spec": "gqa:prism-2x8x1x1024x128", "mirage": None, "prism": (1600, 14, 6.48, "4.9 GiB")},
    "lora": {"spec": "lora", "mirage": ("694982 (stopped)", 0, "> 600", "8.5 GiB"),
             "prism": (41, 0, 0.01, "12 MiB")},
}

RUN = r"""
import json, resource, sys, time
from superopt import workloads, costmodel
from superopt.config import SearchConfig
from superopt.search.driver import run_search
from superopt.targets import TARGETS
spec, concrete, budget = sys.argv[1], sys.argv[2] == "1", float(sys.argv[3])
program = workloads.resolve(spec)
h100 = TARGETS["h100"]
_, reference = workloads.reference_for(spec)
reference_us = costmodel.rank(reference, h100, keep=1)[0][1].time_us
reached = {}  # when the search first held a schedule as fast as the reference

def progress(p):
    if not reached and p["best_time_us"] is not None and p["best_time_us"] <= reference_us * (1 + 1e-9):
        reached.update(seconds=p["seconds"], states=p["states"])

t0 = time.perf_counter()
o = run_search(program, h100, SearchConfig(concrete=concrete), budget_s=budget, progress=progress)
seconds = time.perf_counter() - t0
best = o.best
base = next(v for v in o.verified if v.sgraph.name.endswith(".unfused"))
floor = costmodel.floor(program, h100)
print(json.dumps({
    "spec": spec, "mode": "concrete" if concrete else "symbolic", "seconds": round(seconds, 2),
    "states": o.stats.states, "pruned": o.stats.pruned, "verified": o.stats.verified,
    "budget_exhausted": o.stats.budget_exhausted, "best_us": round(best.best.estimate.time_us, 3),
    "best_found_s": o.stats.best_found_s,
    "to_reference_s": reached.get("seconds"), "to_reference_states": reached.get("states"),
    "kernels": len(best.sgraph.kernels), "baseline_us": round(base.best.estimate.time_us, 3),
    "reference_us": round(reference_us, 3), "vs_reference": round(reference_us / best.best.estimate.time_us, 3),
    "speedup": round(base.best.estimate.time_us / best.best.estimate.time_us, 3),
    "dram_over_floor": round(best.best.estimate.dram_bytes / floor.dram_bytes, 3),
    "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
}))
"""


def run(spec: str, concrete: bool, budget: float) -> dict[str, object]:
    res = subprocess.run([sys.executable, "-c", RUN, spec, "1" if concrete else "0", str(budget)],
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def _anchor(figures: tuple[object, ...] | None) -> str:
    return " / ".join(str(x) for x in figures) if figures else "not measured"


def _run(row: dict[str, object]) -> str:
    return f"{row['seconds']} / {row['states']}" + (" (budget)" if row["budget_exhausted"] else "")


def _reach(row: dict[str, object]) -> str:
    return "never" if row["to_reference_s"] is None else f"{row['to_reference_s']} / {row['to_reference_states']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=300.0, help="per search (anytime beyond it)")
    ap.add_argument("--workloads", default=",".join(workloads.WORKLOADS))
    ap.add_argument("--json", default="out/bench_search.json")
    args = ap.parse_args()
    rows = []
    for name in args.workloads.split(","):
        spec = ANCHORS.get(name, {}).get("spec", name)
        for concrete in (False, True):
            row = run(str(spec), concrete, args.budget_s)
            rows.append(row)
            print(f"{row['spec']:28s} {row['mode']:9s} {row['seconds']:8.2f} s  states {row['states']:8d}  "
                  f"best {row['best_us']} us (reference {row['reference_us']})  x{row['speedup']}", flush=True)
    cols = ["spec", "mode", "seconds", "states", "pruned", "verified", "budget_exhausted", "best_us",
            "best_found_s", "reference_us", "to_reference_s", "to_reference_states", "kernels", "baseline_us",
            "speedup", "dram_over_floor", "peak_mib"]
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    print("\nSymbolic vs concrete and the anchors at the same shapes (Mirage concrete: states / graphs / s / "
          "memory; Prism symbolic: the same). 'to reference' is when a search first held a schedule as fast as "
          "the hand-written reference (s / states; 'never' within the budget); it compares searches that both "
          "ran out of budget, where whole-run states only measure throughput:")
    print("| workload | ours symbolic s / states | ours concrete s / states | concrete/symbolic states | "
          "to reference: symbolic | to reference: concrete | Mirage concrete | Prism symbolic |\n"
          "|---|---|---|---|---|---|---|---|")
    for name in args.workloads.split(","):
        sym = next(r for r in rows if r["spec"] == ANCHORS.get(name, {}).get("spec", name) and r["mode"] == "symbolic")
        con = next(r for r in rows if r["spec"] == sym["spec"] and r["mode"] == "concrete")
        anchor = ANCHORS.get(name, {})
        print(f"| {sym['spec']} | {_run(sym)} | {_run(con)} | {con['states'] / max(1, sym['states']):.1f}x | "
              f"{_reach(sym)} | {_reach(con)} | {_anchor(anchor.get('mirage'))} | {_anchor(anchor.get('prism'))} |")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "anchors": ANCHORS}, indent=2, default=str))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
