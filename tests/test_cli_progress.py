"""Progress on stderr: a bar on a terminal; when piped (a CI log, `make demo | cat`), where a bar
drew nothing for minutes, a plain line at most every few seconds. `--json` stays JSON on stdout."""

from __future__ import annotations

import functools
import io
import json

from rich.console import Console
from typer.testing import CliRunner

from superopt import cli_progress
from superopt.cli import app
from superopt.cli_progress import PLAIN_EVERY_S, Throttle, count_progress, search_progress, search_text


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def event(seconds: float, states: int, best: float | None = None) -> dict:
    return {"phase": "search", "seconds": seconds, "states": states, "pruned": states // 2, "verified": 1,
            "best_time_us": best}


def piped() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, width=160), buf


def test_the_throttle_lets_one_line_through_per_interval():
    clock = FakeClock()
    gate = Throttle(3.0, clock)
    seen = []
    for t in (0.0, 1.0, 2.9, 3.0, 3.1, 5.9, 6.5, 20.0):
        clock.now = t
        if gate():
            seen.append(t)
    assert seen == [0.0, 3.0, 6.5, 20.0]
    assert 2.0 <= PLAIN_EVERY_S <= 5.0


def test_a_piped_search_prints_throttled_plain_lines():
    console, buf = piped()
    clock = FakeClock()
    with search_progress(console, 60.0, Throttle(3.0, clock, first=False)) as progress:
        for t in range(10):  # an event every second, as the search reports
            clock.now = float(t)
            progress(event(float(t), 100 * t, best=17.7 if t >= 4 else None) | {"depth": 2})
    lines = buf.getvalue().splitlines()
    assert lines == [search_text(event(float(t), 100 * t, 17.7 if t >= 4 else None) | {"depth": 2})
                     for t in (3, 6, 9)]
    assert lines[-1] == "search: 9.0 s, 900 states, 450 pruned, 1 verified, depth 2, best 17.70 us"
    assert "\x1b" not in buf.getvalue()  # no escape codes in a log


def test_a_piped_search_shorter_than_the_interval_prints_no_line():
    """Its only line was its first event ("found: 0.0 s, 0 states, ..."), above a report saying
    12 states: a search that ends within `PLAIN_EVERY_S` prints nothing but its report."""
    console, buf = piped()
    clock = FakeClock()
    with search_progress(console, 60.0, Throttle(3.0, clock, first=False)) as progress:
        for t in (0.0, 0.5, 2.9):
            clock.now = t
            progress(event(t, 0))
    assert buf.getvalue() == ""


def test_a_piped_batch_prints_throttled_counts():
    console, buf = piped()
    clock = FakeClock()
    with count_progress(console, "demo", 14, Throttle(3.0, clock)) as update:
        for t, done in ((0.0, 0), (1.0, 1), (3.5, 2), (4.0, 3)):
            clock.now = t
            update(done, "running gqa:ci")
    assert buf.getvalue().splitlines() == ["demo: 0/14 done, running gqa:ci", "demo: 2/14 done, running gqa:ci"]


def test_on_a_terminal_the_bar_takes_every_event():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    with search_progress(console, None) as progress:  # no budget: a pulsing bar
        progress(event(0.5, 10))
    with search_progress(console, 5.0) as progress:
        progress(event(9.0, 10))  # past the budget: a full bar, no error
    with count_progress(console, "batch", 2) as update:
        update(1, "")


def test_optimize_json_is_clean_json_with_progress_on_stderr(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cli_progress, "Throttle", functools.partial(Throttle, 0.0))  # a line per event
    res = CliRunner().invoke(app, ["optimize", "rmsnorm_matmul:ci", "--target", "h100", "--no-cache", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["program"]["name"] == "rmsnorm_matmul:ci"
    progress = [line for line in res.stderr.splitlines() if " states, " in line]
    assert progress and all(" s, " in line and "verified" in line for line in progress), res.stderr
