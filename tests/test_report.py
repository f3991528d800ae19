"""`superopt report RESULTS --html OUT`: a batch's `--json` results as one HTML page whose charts
are inline SVG (no plotting library, no network), with names escaped."""

from __future__ import annotations

import json
import re

from db_fixtures import cli_env
from typer.testing import CliRunner

from superopt.charts import Bar, bar_chart
from superopt.cli import app
from superopt.report import charts, verdict

runner = CliRunner()


def run_batch_json(tmp_path) -> str:
    f = tmp_path / "b.jsonl"
    f.write_text("ntrans:ci\nlora:ci\n" + json.dumps({"program": "gqa:ci", "target": "a100"}) + "\n")
    db = f"sqlite:///{tmp_path / 'superopt.db'}"
    res = runner.invoke(app, ["batch", str(f), "--local", "--db", db, "--optimizer", "db_fixtures:optimize", "--json"],
                        env=cli_env(db))
    assert res.exit_code == 0, res.output
    return res.stdout


def test_report_of_a_real_batch(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(run_batch_json(tmp_path))
    rows = json.loads(results.read_text())
    assert all({"proved", "kernels", "search_s"} <= set(r) for r in rows)  # what the report charts
    out = tmp_path / "report" / "batch.html"
    res = runner.invoke(app, ["report", str(results), "--html", str(out)])
    assert res.exit_code == 0, res.output
    assert f"wrote {out} (3 jobs)" in res.stdout
    page = out.read_text()
    for chart in ("speedup", "search", "kernels", "verdicts"):
        assert re.search(rf'id="chart-{chart}"><svg xmlns="http://www.w3.org/2000/svg" class="chart"', page), chart
    assert "speedup over unfused" in page and "3 proved" in page
    for r in rows:
        assert f"{r['program']} @ {r['target']}" in page and f"{r['speedup']:.2f}×" in page
    assert "&#34;" not in page.split("</style>")[0]  # the inlined CSS is not HTML-escaped
    assert "<link" not in page and "<script" not in page and "src=" not in page  # self-contained, offline


def test_report_escapes_names_and_shows_failures(tmp_path):
    rows = [
        {"line": 1, "job": 1, "program": "<script>x</script>", "target": "h100", "state": "succeeded",
         "cache_hit": True, "time_us": 2.0, "baseline_time_us": 1.0, "speedup": 0.5, "kernel_id": 3,
         "proved": True, "kernels": 2, "search_s": 1.5},
        {"line": 2, "job": 2, "program": "lora:ci", "target": "a100", "state": "failed", "error": "<b>boom</b>"},
        {"line": 3, "job": 3, "program": "gqa:ci", "target": "a100", "state": "succeeded", "speedup": None},
    ]
    results = tmp_path / "r.jsonl"
    results.write_text("\n".join(json.dumps(r) for r in rows) + "\n")  # JSON lines are read too
    out = tmp_path / "r.html"
    assert runner.invoke(app, ["report", str(results), "--html", str(out)]).exit_code == 0
    page = out.read_text()
    assert "<script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert "<b>boom</b>" not in page and "&lt;b&gt;boom&lt;/b&gt;" in page
    assert "1.50 s (cache hit)" in page and 'class="slower"' in page and 'class="bad"' in page
    assert [verdict(r) for r in rows] == ["proved", "failed", "succeeded"]
    assert set(charts(rows)) == {"speedup", "search", "kernels", "verdicts"}


def test_report_refuses_what_is_not_batch_results(tmp_path):
    out = tmp_path / "o.html"
    for text, message in [("{bad", "not batch results"), ("[]", "non-empty JSON list"),
                          ('[{"x": 1}]', "row 1: expected an object with at least 'program' and 'state'")]:
        f = tmp_path / "r.json"
        f.write_text(text)
        res = runner.invoke(app, ["report", str(f), "--html", str(out)])
        assert res.exit_code == 2 and message in res.stderr, res.output
    res = runner.invoke(app, ["report", str(tmp_path / "missing.json"), "--html", str(out)])
    assert res.exit_code == 2 and "no such file" in res.stderr
    assert not out.exists()


def test_bar_chart_escapes_and_scales():
    svg = bar_chart([Bar("a<b", 2.0), Bar("c", 1.0, "one")], title="t&t", reference=1.0, unit="×")
    assert "a&lt;b" in svg and "t&amp;t" in svg and "<b" not in svg.replace("<title", "")
    widths = [float(w) for w in re.findall(r'<rect class="bar" x="\d+" y="[\d.]+" width="([\d.]+)"', svg)]
    assert widths[0] == 2 * widths[1] and 'class="ref"' in svg and ">one<" in svg
    assert "nothing to show yet" in bar_chart([], title="empty")
