"""Does the search generalize beyond the built-in workloads? A seeded family of generated programs.

The family (`family`): chains of 1-16 elementwise ops (bias adds, constant scales, gelu, silu,
sigmoid, relu, residual adds) in random orders after or before matmuls of several shapes,
reductions (sum, mean, max, scaled) after matmuls, row sums and means of biased or column-scaled
matmuls, norms before matmuls (with a chain after),
softmax after a matmul and attention variants (scaled, normed, the softmax spelled out), in f16
and f32. Each program is searched in a fresh subprocess (its peak memory its own) with the in-process
`run_search` on the h100 cost model, within `--budget-s`. Printed per program: states, seconds,
whether the search completed (searched every kernel count that could win, not cut by the budget),
whether the winner is fused (has a graph-defined kernel), its speedup over the unfused baseline,
its time over the physical floor, and whether a fusion beats unfused at all (the cheapest of the
schedules `KernelSearch.program_split` builds directly, one graph kernel per part, by estimate).
The summary: the fused fraction where a fusion beats unfused, median and p95 search time, the
worst case, and programs slower than their unfused baseline. With `--check`, each winner's
generated CUDA also runs in the CPU harness at small shapes against an independent numpy
evaluation of the program (`winner_check.py`): its error, and the programs whose winner is wrong.
Writes JSON.

    .venv/bin/python scripts/bench_generality.py [--budget-s 60] [--count 64] [--seed 0] [--only 3,17]
        [--check] [--json out/bench_generality.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from winner_check import check_winner

from superopt import Program
from superopt.program import Tensor
from superopt.sgraph import SGraph

CHAIN_OPS = ("bias", "scale", "gelu", "silu", "sigmoid", "relu", "residual")
SCALES = (0.5, 0.125, 2.0, 0.7071)
SIDE_INPUTS = 2  # bias and residual inputs a chain reads at most (a kernel reads few tensors)
MATMUL_SHAPES = ((8, 1024, 1024), (16, 4096, 4096), (16, 1024, 4096), (64, 2048, 1024), (32, 512, 2048))
ATTENTION_SHAPES = ((2, 64, 1024, 64), (16, 1, 1024, 128), (8, 128, 512, 64))

RUN = r"""
import json, sys, time
from superopt import costmodel
from superopt.config import SearchConfig
from superopt.search.instantiation import rank
from superopt.program import Program
from superopt.search.driver import run_search
from superopt.search.kernel import KernelSearch
from superopt.search.space import space_of
from superopt.sgraph import GraphKernel
from superopt.targets import TARGETS
from superopt.verifier.oracle import Oracle
program = Program.from_json(json.loads(sys.stdin.read()))
budget = float(sys.argv[1])
h100 = TARGETS["h100"]
t0 = time.perf_counter()
o = run_search(program, h100, SearchConfig(), budget_s=budget)
seconds = time.perf_counter() - t0
best = o.best
base = next(v for v in o.verified if v.sgraph.name.endswith(".unfused"))
split = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
direct = [r[0].estimate.time_us for sg in split.program_split(whole=True) if (r := rank(sg, h100))]
print(json.dumps({
    "seconds": round(seconds, 2), "states": o.stats.states, "complete": not o.stats.budget_exhausted,
    "depth": o.stats.depth, "best_us": best.best.estimate.time_us, "baseline_us": base.best.estimate.time_us,
    "floor_us": costmodel.floor(program, h100).time_s * 1e6, "kernels": len(best.sgraph.kernels),
    "fused": any(isinstance(k, GraphKernel) for k in best.sgraph.kernels),
    "direct_us": min(direct, default=None), "best_found_s": o.stats.best_found_s, "sgraph": best.sgraph.to_json(),
}))
"""


def _chain(p: Program, y: Tensor, length: int, rng: random.Random, tag: str) -> Tensor:
    """`length` elementwise ops on y in a random order, reading at most `SIDE_INPUTS` new inputs."""
    m, n = y.shape
    sides = 0
    for k in range(length):
        kinds = [c for c in CHAIN_OPS if sides < SIDE_INPUTS or c not in ("bias", "residual")]
        kind = rng.choice(kinds)
        if kind in ("bias", "residual"):
            sides += 1
            side = p.input(f"{tag}{k}", (1, n) if kind == "bias" else (m, n), y.dtype or "f16")
            y = p.op("add", y, side) if rng.random() < 0.5 else p.op("add", side, y)
        elif kind == "scale":
            y = p.op("mul", y, rng.choice(SCALES))
        else:
            y = p.op(kind, y)
    return y


def _matmul_chain(rng: random.Random, dtype: str, before: bool) -> Program:
    m, k, n = rng.choice(MATMUL_SHAPES)
    length = rng.randint(1, 16)
    p = Program(f"chain{length}_{'before' if before else 'after'}_{m}x{k}x{n}_{dtype}")
    x, w = p.input("X", (m, k), dtype), p.input("W", (k, n), dtype)
    if before:
        p.output(p.op("matmul", _chain(p, x, length, rng, "S"), w, name="O"))
    else:
        p.output(_chain(p, p.op("matmul", x, w), length, rng, "S"))
    return p


def _reduction_after(rng: random.Random, dtype: str) -> Program:
    m, k, n = rng.choice(MATMUL_SHAPES)
    op = rng.choice(("sum", "mean", "max"))
    p = Program(f"{op}_of_matmul_{m}x{k}x{n}_{dtype}")
    x, w = p.input("X", (m, k), dtype), p.input("W", (k, n), dtype)
    y = p.op(op, p.op("matmul", x, w), dim=-1, keepdim=True)
    p.output(p.op("mul", y, rng.choice(SCALES)) if rng.random() < 0.5 else y)
    return p


def _affine_reduction(rng: random.Random, dtype: str) -> Program:
    """A row sum or mean of X @ W with a bias added or a column scale applied first: the
    reduction can be taken on the weight (X @ rowsum(W) + sum(b), X @ rowsum(W * s))."""
    m, k, n = rng.choice(MATMUL_SHAPES)
    op, side = rng.choice(("sum", "mean")), rng.choice(("bias", "scale"))
    p = Program(f"{op}_of_{'biased' if side == 'bias' else 'scaled'}_matmul_{m}x{k}x{n}_{dtype}")
    x, w, s = p.input("X", (m, k), dtype), p.input("W", (k, n), dtype), p.input("S", (1, n), dtype)
    y = p.op("add" if side == "bias" else "mul", p.op("matmul", x, w), s)
    p.output(p.op(op, y, dim=-1, keepdim=True))
    return p


def _norm_before(rng: random.Random, dtype: str) -> Program:
    m, k, n = rng.choice(MATMUL_SHAPES)
    length = rng.randint(0, 4)
    p = Program(f"rmsnorm_matmul_chain{length}_{m}x{k}x{n}_{dtype}")
    x, w = p.input("X", (m, k), dtype), p.input("W", (k, n), dtype)
    p.output(_chain(p, p.op("matmul", p.rms_norm(x, -1, 1e-6), w), length, rng, "S"))
    return p


def _softmax_after(rng: random.Random, dtype: str) -> Program:
    m, k, n = rng.choice(MATMUL_SHAPES)
    p = Program(f"softmax_of_matmul_{m}x{k}x{n}_{dtype}")
    x, w = p.input("X", (m, k), dtype), p.input("W", (k, n), dtype)
    y = p.op("matmul", x, w)
    if rng.random() < 0.5:
        y = p.op("mul", y, rng.choice(SCALES))
    p.output(p.softmax(y, -1))
    return p


def _attention(rng: random.Random, dtype: str) -> Program:
    b, q, n, dh = rng.choice(ATTENTION_SHAPES)
    variant = rng.choice(("softmax", "spelled", "scaled", "qknorm"))
    p = Program(f"attention_{variant}_{b}x{q}x{n}x{dh}_{dtype}")
    qq, kk, vv = p.input("Q", (b, q, dh), dtype), p.input("K", (b, dh, n), dtype), p.input("V", (b, n, dh), dtype)
    if variant == "qknorm":
        qq = p.rms_norm(qq, -1, 1e-6)
    s = p.op("matmul", qq, kk)
    if variant == "scaled":
        s = p.op("mul", s, 1.0 / dh ** 0.5)
    if variant == "spelled":
        e = p.op("exp", s)
        probs = p.op("div", e, p.sum(e, -1, keepdim=True))
    else:
        probs = p.softmax(s, -1)
    p.output(p.op("matmul", probs, vv, name="O"))
    return p


KINDS: tuple[tuple[str, int, Callable[[random.Random, str], Program]], ...] = (
    ("chain_after", 5, lambda rng, dt: _matmul_chain(rng, dt, before=False)),
    ("chain_before", 2, lambda rng, dt: _matmul_chain(rng, dt, before=True)),
    ("reduction_after", 2, _reduction_after),
    ("affine_reduction", 1, _affine_reduction),
    ("norm_before", 2, _norm_before),
    ("softmax_after", 1, _softmax_after),
    ("attention", 2, _attention),
)


def family(seed: int, count: int) -> list[tuple[str, Program]]:
    """`count` programs, each kind in proportion to its weight, in a fixed order for the seed."""
    rng = random.Random(seed)
    weights = [w for _, w, _ in KINDS]
    out = []
    for i in range(count):
        kind, _, make = rng.choices(KINDS, weights)[0]
        program = make(rng, rng.choice(("f16", "f32")))
        out.append((kind, program))
        program.name = f"g{i:02d}_{program.name}"
    return out


def run(program: Program, budget_s: float, check: bool = False, seed: int = 0) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", RUN, str(budget_s)], input=json.dumps(program.to_json()),
                          capture_output=True, text=True, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    winner = row.pop("sgraph")  # not kept in the table's JSON
    if check:
        outcome = check_winner(program, SGraph.from_json(winner), seed)
        row["check"] = outcome if isinstance(outcome, str) else {
            "error": outcome.error, "tolerance": outcome.tolerance, "shapes": outcome.shapes, "ok": outcome.ok}
    return row


def fusible(row: dict[str, Any]) -> bool:
    """Does a fusion beat unfused: the schedule `program_split` builds directly, or the winner if
    it is fused (estimates)?"""
    base = float(row["baseline_us"])
    direct = row["direct_us"] is not None and float(row["direct_us"]) < base
    return direct or (bool(row["fused"]) and float(row["best_us"]) < base)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures the goal is stated in: fused where a fusion beats unfused, search times, losses."""
    ok = [r for r in rows if "error" not in r]
    fusible_rows = [r for r in ok if fusible(r)]
    times = sorted(float(r["seconds"]) for r in ok)
    worst = max(ok, key=lambda r: float(r["seconds"]), default=None)
    return {
        "programs": len(rows), "errors": len(rows) - len(ok), "complete": sum(1 for r in ok if r["complete"]),
        "fusible": len(fusible_rows), "fused_where_fusible": sum(1 for r in fusible_rows if r["fused"]),
        "fused_fraction": round(sum(1 for r in fusible_rows if r["fused"]) / len(fusible_rows), 3)
        if fusible_rows else None,
        "median_s": round(statistics.median(times), 2) if times else None,
        "p95_s": round(times[min(len(times) - 1, int(0.95 * len(times)))], 2) if times else None,
        "worst": None if worst is None else {"program": worst["program"], "seconds": worst["seconds"]},
        "slower_than_unfused": [r["program"] for r in ok if float(r["best_us"]) > float(r["baseline_us"]) * (1 + 1e-9)],
        "checked": sum(1 for r in ok if isinstance(r.get("check"), dict)),
        "wrong": [r["program"] for r in ok if isinstance(r.get("check"), dict) and not r["check"]["ok"]],
    }


def _check_text(check: dict[str, Any] | str | None) -> str:
    if check is None or isinstance(check, str):
        return check or ""
    return f"{check['error']:.1e} ({check['shapes']})" + ("" if check["ok"] else " WRONG")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=60.0, help="per search (anytime beyond it)")
    ap.add_argument("--count", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="comma-separated indices into the family (default: all)")
    ap.add_argument("--json", default="out/bench_generality.json")
    ap.add_argument("--check", action="store_true",
                    help="run each winner's CUDA in the CPU harness against an independent numpy evaluation")
    args = ap.parse_args()
    programs = family(args.seed, args.count)
    chosen = [int(i) for i in args.only.split(",") if i] or range(len(programs))
    rows = []
    print(f"{'program':48s} {'states':>8s} {'s':>7s} complete fused speedup /floor fusible" +
          " numpy-check" * args.check)
    for i in chosen:
        kind, program = programs[i]
        row = {"program": program.name, "kind": kind, "ops": len(program.nodes),
               **run(program, args.budget_s, args.check, args.seed * 1000 + i)}
        rows.append(row)
        if "error" in row:
            print(f"{program.name:48s} error: {row['error']}", flush=True)
            continue
        speedup = float(row["baseline_us"]) / float(row["best_us"])
        row["speedup"], row["over_floor"] = round(speedup, 3), round(float(row["best_us"]) / float(row["floor_us"]), 3)
        print(f"{program.name:48s} {row['states']:8d} {row['seconds']:7.2f} {row['complete']!s:8s} "
              f"{row['fused']!s:5s} {speedup:7.2f} {row['over_floor']:6.2f} {fusible(row)!s:7s} " +
              _check_text(row.get("check")), flush=True)
    summary = summarize(rows)
    print(json.dumps(summary, indent=1))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seed": args.seed, "budget_s": args.budget_s, "summary": summary, "rows": rows},
                              indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
