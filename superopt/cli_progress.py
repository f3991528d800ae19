"""Progress on the command line, on stderr so that stdout stays the answer (`--json` stays JSON).

On a terminal: a Rich progress bar. Anywhere else (a CI log, `make demo 2>&1 | cat`) a bar draws
nothing until the end, so a long search looked hung for minutes: there a plain line is printed
instead, at most once every PLAIN_EVERY_S seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bar

from superopt.core.progress import Progress

PLAIN_EVERY_S = 3.0  # often enough to show a run is alive, rare enough to keep a CI log readable
Update = Callable[[int, str], None]  # (jobs done, what is running)


class Throttle:
    """True at most once every `every_s` seconds of `clock`; the first call is True, or with
    `first=False` only once `every_s` have passed since the throttle was made."""

    def __init__(self, every_s: float = PLAIN_EVERY_S, clock: Callable[[], float] = time.monotonic,
                 first: bool = True) -> None:
        self.every_s, self.clock = every_s, clock
        self.last: float | None = None if first else clock()

    def __call__(self) -> bool:
        now = self.clock()
        if self.last is not None and now - self.last < self.every_s:
            return False
        self.last = now
        return True


def search_text(p: dict[str, Any]) -> str:
    """A search's progress event as one line: phase, time, states, pruned, verified, depth, best."""
    best = f"{p['best_time_us']:.2f} us" if p.get("best_time_us") else "-"
    depth = f", depth {p['depth']}" if p.get("depth") is not None else ""
    return (f"{p.get('phase', 'search')}: {p.get('seconds', 0.0):.1f} s, {p.get('states', 0)} states, "
            f"{p.get('pruned', 0)} pruned, {p.get('verified', 0)} verified{depth}, best {best}")


@contextmanager
def search_progress(console: Console, budget_s: float | None, throttle: Throttle | None = None) -> Iterator[Progress]:
    """The callback a search reports to: a bar of the time budget spent (no budget: a pulse) on a
    terminal, throttled lines elsewhere, the first once the search has run `PLAIN_EVERY_S` (a
    line at its start would read "0 states" above a report of its real counts)."""
    if not console.is_terminal:
        gate = throttle or Throttle(first=False)

        def line(p: dict[str, Any]) -> None:
            if gate():
                console.print(search_text(p), markup=False, highlight=False)

        yield line
        return
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), TimeElapsedColumn())
    with Bar(*columns, console=console, transient=True) as bar:
        task = bar.add_task("search", total=budget_s)

        def draw(p: dict[str, Any]) -> None:
            spent = p.get("seconds", 0.0)
            bar.update(task, description=search_text(p), completed=min(spent, budget_s) if budget_s else spent)

        yield draw


@contextmanager
def count_progress(console: Console, label: str, total: int, throttle: Throttle | None = None) -> Iterator[Update]:
    """Progress of `total` jobs, updated with (done, what is running): a bar on a terminal,
    throttled lines elsewhere."""
    if not console.is_terminal:
        gate = throttle or Throttle()

        def line(done: int, note: str) -> None:
            if gate():
                console.print(f"{label}: {done}/{total} done" + (f", {note}" if note else ""), markup=False,
                              highlight=False)

        yield line
        return
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Bar(*columns, console=console, transient=True) as bar:
        task = bar.add_task(label, total=total)

        def draw(done: int, note: str) -> None:
            bar.update(task, completed=done, description=f"{label} {note}".rstrip())

        yield draw
