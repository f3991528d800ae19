"""Horizontal bar charts as SVG text, drawn on the server.

The dashboard and `superopt report` both draw them: plain SVG needs no plotting library
(no matplotlib), no JavaScript and no network, and a report file stays one self-contained page.
Every label goes through `html.escape`: program names are user text.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

ROW_H = 22  # px per bar: room for a 12 px label
LABEL_W = 260  # px for the label column; longer labels are cut with an ellipsis
BAR_W = 420  # px for the longest bar
VALUE_W = 90  # px for the value after the bar
MAX_LABEL = 40  # characters


@dataclass(frozen=True)
class Bar:
    """One bar: `label` on the left, `value` as its length, `text` printed after it."""

    label: str
    value: float
    text: str = ""
    kind: str = "bar"  # a CSS class suffix: "bar", "slower" (under the reference line), "bad"


def bar_chart(bars: Sequence[Bar], *, title: str, reference: float | None = None, unit: str = "") -> str:
    """An SVG bar chart of `bars` in the given order; `reference` draws a dashed line at that
    value (1.0 for speedups: a bar short of it is slower than unfused)."""
    esc = html.escape
    height = 34 + ROW_H * max(1, len(bars)) + 10
    width = LABEL_W + BAR_W + VALUE_W
    finite = [b.value for b in bars if math.isfinite(b.value) and b.value > 0]
    top = max([*finite, reference or 0.0, 1e-12])
    scale = BAR_W / top
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">',
        "<style>.chart text{font:12px system-ui,sans-serif;fill:#1f2933}.chart .t{font-weight:600;font-size:13px}"
        ".chart .bar{fill:#3b82c4}.chart .slower{fill:#d08a2a}.chart .bad{fill:#c2410c}"
        ".chart .ref{stroke:#1f2933;stroke-width:1.5;stroke-dasharray:4 3}.chart .grid{stroke:#e4e7eb}</style>",
        f'<text class="t" x="4" y="18">{esc(title)}</text>',
    ]
    if not bars:
        out.append('<text x="4" y="46">nothing to show yet</text>')
    for i, b in enumerate(bars):
        y = 30 + i * ROW_H
        label = b.label if len(b.label) <= MAX_LABEL else b.label[: MAX_LABEL - 1] + "…"
        length = b.value * scale if math.isfinite(b.value) and b.value > 0 else 0.0
        out.append(f'<text x="{LABEL_W - 6}" y="{y + 15}" text-anchor="end"><title>{esc(b.label)}</title>'
                   f"{esc(label)}</text>")
        out.append(f'<rect class="{esc(b.kind)}" x="{LABEL_W}" y="{y + 3}" width="{length:.1f}" height="{ROW_H - 6}"/>')
        text = b.text or (f"{b.value:.3g}{unit}" if math.isfinite(b.value) else "–")
        out.append(f'<text x="{LABEL_W + length + 5:.1f}" y="{y + 15}">{esc(text)}</text>')
    if reference is not None and bars:
        x = LABEL_W + reference * scale
        out.append(f'<line class="ref" x1="{x:.1f}" y1="26" x2="{x:.1f}" y2="{height - 6}"/>')
        out.append(f'<text x="{x + 3:.1f}" y="{height - 2}" font-size="10">{esc(f"{reference:g}{unit}")}</text>')
    out.append("</svg>")
    return "\n".join(out)


def speedup_bars(rows: Sequence[tuple[str, float | None]]) -> list[Bar]:
    """Bars for (label, speedup over unfused) pairs, fastest first; a missing speedup shows as "–"."""
    ordered = sorted(rows, key=lambda r: -(r[1] or 0.0))
    return [Bar(label, s if s is not None else math.nan, f"{s:.2f}×" if s is not None else "–",
                "bar" if s is None or s >= 1.0 else "slower") for label, s in ordered]
