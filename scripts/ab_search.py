"""In-process search of the working tree against an older commit, alternated in one run.

These machines are shared and noisy, so a speedup is only believable when old and new run in the
same minutes: each round runs every workload once with the commit's code and once with the working
tree's, each in a fresh subprocess, and the table reports medians, the ratio, and whether states
and winners agree. The old code runs from a temporary `git worktree`; it must be loaded by path
(`superopt.__path__`), because the editable install maps `superopt.search` to this checkout's
`search/` whatever `sys.path` says. Measure without a profiler: cProfile charges many small calls
far more than they cost.

    .venv/bin/python scripts/ab_search.py --against HEAD~1 [--workloads gqa,rmsnorm_mlp] [--rounds 2] [--max-states N]

A workload may also be a program JSON file (`scripts/programs/` holds programs that are no
built-in workload but that a change was measured on).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RUN_ONE = """
import hashlib, json, sys, time
root = sys.argv[1]
sys.path.insert(0, root)
import superopt
superopt.__path__.insert(0, root)
import superopt.search.driver as driver
assert driver.__file__.startswith(root), driver.__file__
from superopt.config import SearchConfig
from superopt.loading import load_program
from superopt.targets import TARGETS
program = load_program(sys.argv[2])
t0 = time.perf_counter()
out = driver.run_search(program, TARGETS["h100"], SearchConfig(), budget_s=float(sys.argv[3]),
                        max_states=int(sys.argv[4]) if sys.argv[4] != "None" else None)
print(json.dumps({"seconds": time.perf_counter() - t0, "states": out.stats.states,
                  "exhausted": out.stats.budget_exhausted, "best_us": out.best.best.estimate.time_us,
                  "winner": hashlib.sha256(out.best.sgraph.dumps().encode()).hexdigest()[:12]}))
"""


def run_one(tree: Path, spec: str, budget_s: float, max_states: int | None) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", RUN_ONE, str(tree), spec, str(budget_s), str(max_states)],
                          capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", required=True, help="the commit to compare with (any git revision)")
    ap.add_argument("--workloads", default="gqa,rmsnorm_mlp")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--max-states", type=int, default=None,
                    help="stop both at this many states: the same work, when the time budget would cut them apart")
    ap.add_argument("--json", default="out/ab_search.json")
    args = ap.parse_args()
    specs = [str(Path(s).resolve()) if Path(s).is_file() else s for s in args.workloads.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.against],
                       check=True, capture_output=True)
        try:
            runs: dict[str, dict[str, list[dict[str, object]]]] = {s: {"old": [], "new": []} for s in specs}
            for _ in range(args.rounds):
                for spec in specs:
                    runs[spec]["old"].append(run_one(old, spec, args.budget_s, args.max_states))
                    runs[spec]["new"].append(run_one(ROOT, spec, args.budget_s, args.max_states))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=True)
    rows = []
    print("| workload | old s (median) | new s (median) | new/old | old states | new states | same winner |")
    print("|---|---|---|---|---|---|---|")
    for spec in specs:
        old_s = statistics.median(float(r["seconds"]) for r in runs[spec]["old"])
        new_s = statistics.median(float(r["seconds"]) for r in runs[spec]["new"])
        o, n = runs[spec]["old"][0], runs[spec]["new"][0]
        same = o["winner"] == n["winner"]
        name = Path(spec).stem if Path(spec).is_file() else spec
        rows.append({"workload": name, "old_s": round(old_s, 2), "new_s": round(new_s, 2),
                     "ratio": round(new_s / old_s, 3), "old_states": o["states"], "new_states": n["states"],
                     "same_winner": same, "runs": runs[spec]})
        print(f"| {name} | {old_s:.2f} | {new_s:.2f} | {new_s / old_s:.2f} | {o['states']} | {n['states']} | {same} |")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"against": args.against, "rows": rows}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
