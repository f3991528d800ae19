"""Judge the proof corpora of tests/proof_corpus.py and print a table and the proved/total figures.

Corpus A holds wrong schedules (wrong at their real shapes, right only if two distinct dims had
one size): the e-graph must refuse every one. Corpus B holds correct but unusual schedules: the
figure is how many the e-graph proves (counting those right for every size). Per case: the
numeric truth (the interpreter in float64 at the real shapes, two instantiations, against the
reference), the e-graph's verdict alone and its time; with --verify, `verify`'s verdict too.

    .venv/bin/python scripts/proof_corpus.py [--corpus A|B|both] [--verify] [--json out/proof_corpus.json]

`--json -` prints the JSON instead of the table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from superopt.verifier.verify import verify

CORPUS_FILE = Path(__file__).resolve().parent.parent / "tests" / "proof_corpus.py"


def _load_corpus() -> ModuleType:
    """tests/proof_corpus.py, loaded by path: this script has its name, so a plain import (and
    mypy) would find the script itself."""
    spec = importlib.util.spec_from_file_location("proof_corpus", CORPUS_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["proof_corpus"] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


corpus_module = _load_corpus()


def judge(corpus: str, case: Any, with_verify: bool) -> dict[str, Any]:
    """One row: what the numbers say, what the e-graph says (and `verify`, when asked)."""
    program, sg = case.build()
    errors = corpus_module.numeric_errors(program, sg)
    truth = "wrong" if corpus_module.is_wrong(errors) else "right" if corpus_module.is_right(errors) else "unclear"
    proof = corpus_module.egraph_proof(program, sg)
    row: dict[str, Any] = {
        "corpus": corpus,
        "case": case.name,
        "every_size": case.every_size,
        "numeric": truth,
        "max_rel_err": max(errors, default=None),
        "egraph": "proved" if proof.proved else f"refused ({proof.reason})",
        "egraph_proved": proof.proved,
        "egraph_ms": round(proof.seconds * 1e3, 1),
        "enodes": proof.enodes,
    }
    if with_verify:
        t0 = time.perf_counter()
        row["verify_proved"] = verify(program, sg).proved
        row["verify_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    return row


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Corpus A: how many wrong schedules the e-graph (and verify) proved, which it must not;
    corpus B: how many of those right for every size it proved, and which it refused."""
    a = [r for r in rows if r["corpus"] == "A"]
    b = [r for r in rows if r["corpus"] == "B" and r["every_size"]]
    out: dict[str, Any] = {}
    if a:
        out["A"] = {"total": len(a), "egraph_wrongly_proved": [r["case"] for r in a if r["egraph_proved"]],
                    "numerically_wrong": sum(r["numeric"] == "wrong" for r in a)}
        if "verify_proved" in a[0]:
            out["A"]["verify_wrongly_proved"] = [r["case"] for r in a if r["verify_proved"]]
    if b:
        out["B"] = {"total": len(b), "egraph_proved": sum(r["egraph_proved"] for r in b),
                    "egraph_refused": [r["case"] for r in b if not r["egraph_proved"]],
                    "numerically_right": sum(r["numeric"] == "right" for r in b)}
    return out


def print_table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    cols = ["corpus", "case", "numeric", "max_rel_err", "egraph", "egraph_ms"]
    if rows and "verify_proved" in rows[0]:
        cols += ["verify_proved", "verify_ms"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        cells = [f"{r[c]:.2g}" if c == "max_rel_err" and r[c] is not None else str(r[c]) for c in cols]
        if not r["every_size"]:
            cells[1] += " (right at these sizes only)"
        print("| " + " | ".join(cells) + " |")
    if "A" in summary:
        a = summary["A"]
        _print_figure(f"\ncorpus A: e-graph refused {a['total'] - len(a['egraph_wrongly_proved'])}/{a['total']} wrong"
                      f" schedules ({a['numerically_wrong']}/{a['total']} shown wrong by the numbers)",
                      "wrongly proved", a["egraph_wrongly_proved"])
        if "verify_wrongly_proved" in a:
            print(f"  verify proved {len(a['verify_wrongly_proved'])}/{a['total']}")
    if "B" in summary:
        b = summary["B"]
        _print_figure(f"corpus B: e-graph proved {b['egraph_proved']}/{b['total']} correct schedules"
                      f" ({b['numerically_right']}/{b['total']} shown right by the numbers)",
                      "refused", b["egraph_refused"])


def _print_figure(headline: str, label: str, cases: list[str]) -> None:
    """A corpus's figure, then each case it counts against the e-graph."""
    print(headline)
    for name in cases:
        print(f"  {label}: {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", choices=["A", "B", "both"], default="both")
    ap.add_argument("--verify", action="store_true", help="also run verify() on each case (every layer)")
    ap.add_argument("--json", help="write the rows and figures here ('-': print them instead of the table)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    chosen = [("A", corpus_module.WRONG), ("B", corpus_module.CORRECT)]
    rows = [judge(label, case, args.verify) for label, corpus in chosen if args.corpus in (label, "both")
            for case in corpus.values()]
    summary = figures(rows)
    report = {"rows": rows, "figures": summary, "seconds": round(time.perf_counter() - t0, 2)}
    if args.json == "-":
        print(json.dumps(report, indent=1))
        return
    print_table(rows, summary)
    print(f"\ntotal {report['seconds']} s")
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
