"""`superopt report RESULTS --html OUT`: a batch's results as one self-contained HTML page.

RESULTS is what `superopt batch FILE --json` prints (a JSON list of summary rows, see
`superopt.batch.summary_rows`); JSON lines of the same rows are read too. The page draws the
dashboard's SVG charts (speedup over unfused, search time, kernels, verdicts) on the server, with
the CSS inlined: it opens offline, can be mailed or archived, and needs no plotting library.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

import superopt
from superopt.charts import Bar, bar_chart, speedup_bars
from superopt.db.errors import RequestError
from superopt.jsontext import JSONTextError, parse_json

MAX_ROWS = 100_000  # a batch file is a list of programs: far fewer


def read_results(path: Path) -> list[dict[str, Any]]:
    """The rows of a batch results file, or a RequestError naming the file (or line) and problem."""
    if not path.is_file():
        raise RequestError(str(path), "a directory, not a file" if path.is_dir() else "no such file")
    text = path.read_text(encoding="utf-8-sig")
    try:
        data: Any = parse_json(text) if text.lstrip().startswith("[") else [
            parse_json(line) for line in text.splitlines() if line.strip()]
    except JSONTextError as e:
        raise RequestError(str(path), f"not batch results (`superopt batch FILE --json`): {e}") from None
    if not isinstance(data, list) or not data:
        raise RequestError(str(path), "expected a non-empty JSON list of batch result rows")
    for n, row in enumerate(data[:MAX_ROWS], start=1):
        if not isinstance(row, dict) or not isinstance(row.get("program"), str) or "state" not in row:
            raise RequestError(f"{path}: row {n}", "expected an object with at least 'program' and 'state'")
    return data[:MAX_ROWS]


def _label(row: dict[str, Any]) -> str:
    return f"{row['program']} @ {row.get('target', '?')}"


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


def verdict(row: dict[str, Any]) -> str:
    """One word per row: proved, not proved, or the state of a job that did not succeed."""
    if row.get("state") != "succeeded":
        return str(row.get("state"))
    if row.get("proved") is None:
        return "succeeded"  # results written before rows carried the verdict
    return "proved" if row["proved"] else "not proved"


def charts(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """The report's four SVG charts, by name."""
    done = [r for r in rows if r.get("state") == "succeeded"]
    speedups = bar_chart(speedup_bars([(_label(r), _number(r.get("speedup"))) for r in done]),
                         title="speedup over unfused", reference=1.0, unit="×")
    timed = sorted(((_label(r), _number(r.get("search_s")), bool(r.get("cache_hit"))) for r in done),
                   key=lambda t: -(t[1] or 0.0))
    search = bar_chart([Bar(label, s if s is not None else math.nan,
                            "–" if s is None else f"{s:.2f} s" + (" (cache hit)" if hit else ""))
                        for label, s, hit in timed], title="search time (a cache hit shows its original search)")
    kernels = bar_chart([Bar(_label(r), k, f"{int(k)}") for r in done
                         if (k := _number(r.get("kernels"))) is not None], title="kernels in the best schedule")
    counts = Counter(verdict(r) for r in rows)
    kinds = {"proved": "bar", "succeeded": "bar", "not proved": "slower"}
    verdicts = bar_chart([Bar(v, n, str(n), kinds.get(v, "bad")) for v, n in counts.most_common()],
                         title="verdicts (jobs)")
    return {"speedup": speedups, "search": search, "kernels": kernels, "verdicts": verdicts}


def render_report(rows: Sequence[dict[str, Any]], source: str) -> str:
    """The HTML page (autoescaped: program names and errors are user text)."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("superopt", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    css = resources.files("superopt").joinpath("static", "dashboard.css").read_text(encoding="utf-8")
    fmt = {"us": lambda x: "–" if _number(x) is None else f"{x:,.2f} µs",
           "x": lambda x: "–" if _number(x) is None else f"{x:.2f}×",
           "s": lambda x: "–" if _number(x) is None else f"{x:.2f} s"}
    env.filters.update(fmt)
    summary = Counter(verdict(r) for r in rows)
    return env.get_template("report.html").render(
        rows=rows, charts=charts(rows), css=css, source=source, version=superopt.__version__,
        summary=sorted(summary.items()), verdict=verdict,
        hits=sum(1 for r in rows if r.get("cache_hit")),
    )


def write_report(results: Path, out: Path) -> int:
    """Write the report of `results` to `out`; returns the number of rows."""
    rows = read_results(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(rows, results.name), encoding="utf-8")
    return len(rows)

