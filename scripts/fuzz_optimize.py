"""Random small programs through `superopt.optimize`: is every answer proved, and is it fused?

Each program is a short random chain over X @ W (unary ops, norms, softmax, reductions against X,
constants; sometimes a second product X @ V, a trailing norm or reduction as a second output),
in f16, bf16 or f32, batched or not, drawn from `--seed`. Printed per program: its ops, the
search time, the winner's kernel count and speedup over the unfused baseline, and a verdict:
`ok` (proved), `baseline` (no fused schedule proved within the budget: a search or prover gap to
look at), `error` (optimize raised; the message), `NOT PROVED` (a soundness failure: never
expected). With `--check`, each winner's generated CUDA also runs in the CPU harness against an
independent numpy evaluation of the program (`winner_check.py`): `WRONG` when it disagrees (a
soundness failure of the prover, the codegen or both: never expected). Writes JSON. Bugs it
found: float checks at inputs where the program overflows its dtype, programs defined only at
negative inputs, unfusable negations, unprovable swapped differences.

    .venv/bin/python scripts/fuzz_optimize.py [--seed 1] [--count 30] [--budget-s 20] [--json out/fuzz.json]
        [--intermediate-outputs] [--layouts] [--heads] [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

from winner_check import check_winner

from superopt import Program
from superopt.api import optimize
from superopt.ops import Op
from superopt.program import Tensor

UNARY = [Op.EXP, Op.SQRT, Op.SILU, Op.RELU, Op.NEG, Op.SQUARE, Op.SIGMOID, Op.GELU, Op.RSQRT]
BINARY = [Op.ADD, Op.MUL, Op.SUB, Op.DIV]


def random_program(rng: random.Random, intermediate: bool = False, layouts: bool = False, heads: bool = False,
                   ) -> Program:
    """A random program; `intermediate` sometimes returns the value fed to the product too (the
    draws before it are unchanged, so each seed's other programs stay the same); `layouts`
    sometimes stores W transposed (read as transpose(W)), transposes the product before the ops
    after it (a transpose of a computed value in the middle; sometimes the product is returned
    too) and returns the result transposed (drawn apart, leaving the other draws as they were);
    `heads` sometimes splits the product's columns into two heads (a reshape of a computed value)
    before the ops after it, which then work per head."""
    p = Program(f"fuzz{rng.randrange(10**6)}")
    dtype = rng.choice(["f16", "f16", "bf16", "f32"])
    n, d, e = rng.choice([(4, 8, 6), (2, 16, 8), (8, 4, 12), (16, 32, 8)])
    batch = (2,) if rng.random() < 0.3 else ()
    layout = random.Random(f"{p.name}-layout")
    w_stored_transposed = layouts and layout.random() < 0.5
    out_transposed = layouts and layout.random() < 0.4
    mid_transposed = layouts and layout.random() < 0.4
    product_returned = layouts and layout.random() < 0.3  # with mid_transposed: the product returned too
    split = heads and layout.random() < 0.6
    swap = (*range(len(batch)), len(batch) + 1, len(batch))  # the last two dims exchanged
    x = p.input("X", (*batch, n, d), dtype)
    w = p.transpose(p.input("W", (*batch, e, d), dtype), swap) if w_stored_transposed else \
        p.input("W", (*batch, d, e), dtype)
    t: Tensor = x
    for _ in range(rng.randrange(0, 4)):
        r = rng.random()
        if r < 0.25:
            t = p.op(rng.choice(UNARY), t)
        elif r < 0.4:
            t = p.rms_norm(t, -1)
        elif r < 0.5:
            t = p.softmax(t, -1)
        elif r < 0.7:
            t = p.op(rng.choice(BINARY), t, x)
        elif r < 0.85:
            t = p.op(rng.choice([Op.DIV, Op.SUB, Op.MUL]), t, p.op(rng.choice([Op.SUM, Op.MEAN, Op.MAX]), x, dim=-1,
                                                                     keepdim=True))
        else:
            t = p.op(rng.choice([Op.MUL, Op.ADD, Op.DIV]), t, rng.choice([0.5, 2.0, 3.0]))
    out = t @ w
    if rng.random() < 0.3:
        out = p.op(rng.choice([Op.ADD, Op.MUL]), out, x @ p.input("V", (*batch, d, e), dtype))
    if split:
        out = p.reshape(out, (*batch, n, 2, e // 2))
        swap = (*range(len(batch) + 1), len(batch) + 2, len(batch) + 1)
    returned = [out] if mid_transposed and product_returned else []
    if mid_transposed:
        out = p.transpose(out, swap)
    if rng.random() < 0.3:
        out = p.op(rng.choice(UNARY[:4]), out)
    extra = [p.op(rng.choice([Op.SUM, Op.MAX]), out, dim=-1, keepdim=True)] if rng.random() < 0.2 else []
    if rng.random() < 0.2:
        out = p.rms_norm(out, -1)
    if intermediate and not extra and t is not x and rng.random() < 0.5:
        extra = [t]
    p.output(p.transpose(out, swap) if out_transposed else out, *extra, *returned)
    return p


def run(program: Program, budget_s: float, check: bool = False, seed: int = 0) -> dict[str, object]:
    ops = [n.op for n in program.topological() if n.op not in ("input", Op.CONST)]
    row: dict[str, object] = {"program": program.name, "summary": program.summary(), "ops": ops}
    t0 = time.perf_counter()
    try:
        result = optimize(program, target="h100", budget_s=budget_s, cache=False, reuse=False)
        report = result.report()
    except Exception as e:  # every failure is a finding to print
        row.update(seconds=round(time.perf_counter() - t0, 2), verdict="error", error=f"{type(e).__name__}: {e}")
        return row
    best = report["best"]
    proved = best["verdict"]["egraph"] == "proved" and \
        best["verdict"]["float_max_rel_err"] <= best["verdict"]["float_tolerance"]
    fused = not best["sgraph"]["name"].endswith(".unfused")
    row.update(seconds=round(time.perf_counter() - t0, 2), kernels=best["kernels"], speedup=round(best["speedup"], 2),
               budget_exhausted=report["search"]["budget_exhausted"],
               verdict="NOT PROVED" if not proved else "ok" if fused else "baseline")
    if check:
        outcome = check_winner(program, result.best.sgraph, seed)
        if isinstance(outcome, str):
            row.update(check=outcome)
        else:
            row.update(check_error=outcome.error, check_tolerance=outcome.tolerance, check_shapes=outcome.shapes)
            if not outcome.ok:
                row.update(verdict="WRONG")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=30)
    ap.add_argument("--budget-s", type=float, default=20.0)
    ap.add_argument("--json", default="out/fuzz.json")
    ap.add_argument("--intermediate-outputs", action="store_true",
                    help="sometimes return the product's left operand as well (a value the kernel also computes from)")
    ap.add_argument("--heads", action="store_true",
                    help="sometimes split the product into two heads (a reshape) before the ops after it")
    ap.add_argument("--layouts", action="store_true",
                    help="sometimes store W transposed, transpose the product, return the result transposed")
    ap.add_argument("--check", action="store_true",
                    help="run each winner's CUDA in the CPU harness against an independent numpy evaluation")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as cache:  # kept sGraphs of throwaway programs go nowhere
        os.environ["SUPEROPT_CACHE_DIR"] = cache
        for i in range(args.count):
            program = random_program(random.Random(args.seed * 1000 + i), args.intermediate_outputs, args.layouts,
                                     args.heads)
            row = run(program, args.budget_s, args.check, args.seed * 1000 + i)
            rows.append(row)
            detail = row.get("error") or f"{row['kernels']} kernels, x{row['speedup']}"
            if args.check:
                detail += f", numpy check {row.get('check') or format(row['check_error'], '.2e')}"
            print(f"{i:3d} {row['verdict']:10s} {row['seconds']:6.1f} s  {detail}  {' '.join(row['ops'])}", flush=True)
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("ok", "baseline", "error", "NOT PROVED", "WRONG")}
    print("\n| " + " | ".join(counts) + " |\n|" + "---|" * len(counts) + "\n| " +
          " | ".join(str(c) for c in counts.values()) + " |")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seed": args.seed, "budget_s": args.budget_s, "counts": counts, "rows": rows}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
