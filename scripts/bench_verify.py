"""Benchmark the verifier per built-in workload (published shapes) and print a table + JSON.

Per workload: e-graph proof time and size for the reference sGraph, finite-field time per
instantiation, the whole `verify` call, the oracle's saturation and its lookup latency (median
and p99 over the abstract expressions of the reference and of its generated mutants, each looked
up once, uncached), and the mutation suite counts at the :ci shape (mutants shown wrong by the
interpreter, never proved by the e-graph, rejected by finite fields).

    .venv/bin/python scripts/bench_verify.py [--json out/bench_verify.json] [--no-mutants]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from superopt import workloads
from superopt.assignments import pick_for_checks
from superopt.instantiate import instantiate
from superopt.interpreter import run_float
from superopt.mutations import mutants
from superopt.reference import inputs_and_reference, max_rel_err
from superopt.shrink import shrink, shrink_sgraph
from superopt.targets import TARGETS
from superopt.verifier import finite_field
from superopt.verifier.egraph import prove
from superopt.verifier.lowering import lower_program, lower_sgraph
from superopt.verifier.oracle import Oracle, abstract_sgraph
from superopt.verifier.verify import verify


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def bench(name: str, with_mutants: bool) -> dict[str, object]:
    h100 = TARGETS["h100"]
    program, ref = workloads.reference_for(name)
    rhs, axes = lower_sgraph(ref, program)
    proof = prove(list(zip(lower_program(program), rhs, strict=True)), axes)
    small = shrink(program)
    small_ref = shrink_sgraph(ref, program, small)
    assert small_ref is not None  # the built-in workloads reshape nothing
    picks = pick_for_checks(small_ref, h100, 3)
    t0 = time.perf_counter()
    for i, v in enumerate(picks):
        assert finite_field.check(small, instantiate(small_ref, v, h100), trials=2, seed=i).passed
    ff_ms = (time.perf_counter() - t0) * 1e3 / max(1, len(picks))
    t0 = time.perf_counter()
    verdict = verify(program, ref)
    verify_ms = (time.perf_counter() - t0) * 1e3
    oracle = Oracle(program)
    ci_program, ci_ref = workloads.reference_for(f"{name}:ci")
    variants = mutants(ci_ref, ci_program)
    exprs = {e for _, _, e in abstract_sgraph(ref, program)}
    for _, m in variants:
        exprs |= {e for _, _, e in abstract_sgraph(m, ci_program)}
    lookups = []
    for e in exprs:
        t0 = time.perf_counter()
        oracle.contains(e)
        lookups.append((time.perf_counter() - t0) * 1e3)
    row: dict[str, object] = {
        "workload": name,
        "proved": verdict.proved,
        "proof_ms": round(proof.seconds * 1e3, 1),
        "proof_iterations": proof.iterations,
        "egraph_enodes": proof.enodes,
        "rule_applications": sum(proof.rule_matches.values()),
        "finite_field_ms_per_instantiation": round(ff_ms, 1),
        "verify_ms": round(verify_ms, 1),
        "oracle_saturate_ms": round(oracle.stats.saturate_ms, 1),
        "oracle_enodes": oracle.stats.enodes,
        "oracle_lookups": len(lookups),
        "oracle_median_ms": round(statistics.median(lookups), 3),
        "oracle_p99_ms": round(percentile(lookups, 0.99), 3),
    }
    if with_mutants:
        row.update(mutation_counts(ci_program, variants))
    return row


def mutation_counts(program, variants) -> dict[str, int]:
    h100 = TARGETS["h100"]
    inputs, refs = inputs_and_reference(program, 11)
    want = refs[0]
    lhs = lower_program(program)
    wrong = proved = ff_rejected = 0
    for _, m in variants:
        checks = pick_for_checks(m, h100, 2)
        if not checks or all(max_rel_err(run_float(instantiate(m, v, h100), inputs)[0], want) <= 0.05 for v in checks):
            continue
        wrong += 1
        rhs, axes = lower_sgraph(m, program)
        proved += prove(list(zip(lhs, rhs, strict=True)), axes).proved
        ff = [finite_field.check(program, instantiate(m, v, h100), trials=1, seed=3).passed for v in checks]
        ff_rejected += not all(ff)
    return {
        "mutants": len(variants), "mutants_wrong": wrong, "mutants_proved": proved, "mutants_ff_rejected": ff_rejected,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="out/bench_verify.json")
    ap.add_argument("--no-mutants", action="store_true", help="skip the mutation-suite counts")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = [bench(name, not args.no_mutants) for name in workloads.WORKLOADS]
    cols = ["workload", "proved", "proof_ms", "egraph_enodes", "rule_applications", "finite_field_ms_per_instantiation",
            "verify_ms", "oracle_median_ms", "oracle_p99_ms"]
    if not args.no_mutants:
        cols += ["mutants", "mutants_wrong", "mutants_proved", "mutants_ff_rejected"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    total = time.perf_counter() - t0
    print(f"\ntotal {total:.1f} s")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "seconds": total}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
