"""Rich renderings of jobs, cache entries, kernels and batch summaries for the command line."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rich.table import Table
from rich.text import Text

from superopt.db.audit import BadRow
from superopt.db.cache import CacheEntry
from superopt.db.jobs import JobView
from superopt.db.models import utcnow
from superopt.limits import printable
from superopt.render import render_sgraph
from superopt.sgraph import SGraph
from superopt.worker import cache_note


def _plain(x: Any) -> Text:
    """A table cell of text from the database: never Rich markup, nothing that does not print."""
    return Text(printable(str(x)))


def _us(x: Any) -> str:
    return f"{x:.2f}" if isinstance(x, int | float) else "-"


def _x(x: Any) -> str:
    return f"{x:.2f}x" if isinstance(x, int | float) else "-"


def _elapsed(start: datetime | None, end: datetime | None) -> str:
    if start is None:
        return "-"
    return f"{((end or utcnow()) - start).total_seconds():.1f} s"


def job_table(v: JobView) -> Table:
    """Everything `superopt status` and `superopt watch` show of one job."""
    t = Table(show_header=False, title=f"job {v.id}", title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    p, r = v.progress, v.result or {}
    rows = [
        ("state", v.state.value + (" (cache hit)" if v.cache_hit else "")),
        ("program", f"{v.program_name}  {v.program_hash[:16]}"),
        ("target", v.target),
        ("phase", str(p.get("phase", "-"))),
        ("states / pruned / verified", f"{p.get('states', 0)} / {p.get('pruned', 0)} / {p.get('verified', 0)}"),
        ("best so far (us)", _us(p.get("best_time_us"))),
        ("attempts", f"{v.attempts}" + (f"  on {v.worker_id}" if v.worker_id else "")),
        ("elapsed", _elapsed(v.started_at, v.finished_at)),
    ]
    if v.result:
        rows += [
            ("time (us)", f"{_us(r.get('time_us'))} ({r.get('time_source')})"),
            ("unfused (us)", _us(r.get("baseline_time_us"))),
            ("speedup", _x(r.get("speedup"))),
            ("kernel", f"{r.get('kernel_id')}" + ("" if r.get("cached") else f"  ({cache_note(r)})")),
        ]
    if v.error:
        rows.append(("error", v.error))
    for k, val in rows:
        t.add_row(k, _plain(val))
    return t


def entries_table(entries: list[CacheEntry]) -> Table:
    t = Table("kernel", "program", "hash", "shapes", "target", "config", "version", "time (us)", "unfused (us)",
              "speedup", "stored", title="kernel cache", title_justify="left")
    for e in entries:
        shapes = " ".join("x".join(map(str, s)) for s in e.shapes)
        t.add_row(
            str(e.kernel_id), _plain(e.program_name), _plain(e.program_hash[:12]), shapes, _plain(e.target),
            _plain(e.config_hash[:8]), _plain(e.version),
            _us(e.time_us), _us(e.baseline_time_us), _x(e.baseline_time_us / e.time_us if e.time_us > 0 else None),
            "-" if e.created_at is None else e.created_at.isoformat(sep=" ", timespec="seconds"),
        )
    return t


def audit_table(bad: list[BadRow]) -> Table:
    """The rows `superopt cache verify` found bad; problems are plain text (never Rich markup)."""
    t = Table("table", "id", "program", "problem", title="bad rows", title_justify="left")
    for b in bad:
        t.add_row(b.table, str(b.id), _plain(b.program), Text("\n".join(map(printable, b.problems))))
    return t


def kernel_text(k: dict[str, Any]) -> str:
    """A stored kernel: the sGraph with its parameters, times, verdict and where it came from."""
    verdict = k.get("verdict") or {}
    lines = [
        f"kernel {k['id']}  {'cached winner' if k['winner'] else 'candidate'} of job {k['job_id']}",
        f"program {k['program']['name']}  {k['program']['hash'][:16]}   target {k['target']['name']}"
        f"   config {k['config_hash']}",
        f"time {_us(k['time_us'])} us ({k['time_source']}), {k['kernels']} kernel(s), "
        f"{k['graph_defined_kernels']} graph-defined, {k['dram_bytes']} DRAM bytes",
        f"verdict: {'proved' if verdict.get('proved') else 'not proved'} (e-graph {verdict.get('egraph', '-')}, "
        f"{verdict.get('finite_field_trials', 0)} finite-field trials)",
        render_sgraph(SGraph.from_json(k["sgraph"]), k["params"]),
    ]
    if k.get("cuda"):
        lines += ["", k["cuda"]]
    return "\n".join(printable(line) for text in lines for line in text.split("\n"))


def batch_table(rows: list[dict[str, Any]]) -> Table:
    t = Table("line", "job", "program", "hash", "target", "state", "cache", "time (us)", "unfused (us)", "speedup",
              "kernel or error", title="batch", title_justify="left")
    for r in rows:
        t.add_row(
            str(r["line"]), str(r["job"]), _plain(r["program"]), r["hash"][:12], _plain(r["target"]), r["state"],
            "hit" if r["cache_hit"] else ("-" if r["state"] != "succeeded" else "searched"),
            _us(r["time_us"]), _us(r["baseline_time_us"]), _x(r["speedup"]),
            str(r["kernel_id"]) if r["kernel_id"] is not None else _plain(r["error"] or "-"),
        )
    return t
