"""A picture of an sGraph as SVG (DESIGN.md §11: "an sGraph is a picture").

The kernel graph is drawn top to bottom in layers: graph-defined kernels (blue, square corners),
library kernels (orange, rounded) and free views or constants (grey, dashed, no launch) are told
apart by shape, colour and a legend; every tensor is an edge, labelled once with its name, shape
and dtype. Inside each graph-defined kernel its block graph is drawn the same way: inputs with
their imap and fmap spelled out ("grid: split cols over gx", "loop: walk rows by F"), the loop
body inside a dashed loop frame, accumulators, post-loop ops, and outputs with their omap. Grid
and loop sizes stay symbolic; with launch parameters each size also shows its value.

The layout is computed here, with no external tool, so the picture is the same on every machine
and the same sGraph always gives byte-identical SVG. Every name is data: it is shown with control
and invisible characters spelled out, shortened when long (the whole name is in a <title>), and
XML-escaped.

    svg_text = render_svg(sgraph, {"gx": 48, "F": 4})
"""

from __future__ import annotations

import unicodedata
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import pairwise
from typing import Any
from xml.sax.saxutils import escape

from superopt.costmodel import is_free
from superopt.sgraph import Axis, BlockOp, GraphKernel, LibraryKernel, SGraph
from superopt.sizes import Size

FONT = "DejaVu Sans Mono, Menlo, Consolas, monospace"  # monospace: text widths can be computed
FONT_SIZE = 12
SMALL = 11
CHAR_W = 0.61  # advance of a monospace character, in ems (DejaVu Sans Mono: 0.602)
LINE_H = 15
PAD = 6  # inside a node, around its text
NAME_LIMIT = 32  # characters of a name shown; longer ones end in an ellipsis
MARGIN = 16
PORT_STEP = 28  # horizontal distance between the edges entering or leaving one node

# (fill, stroke) of each kind of thing drawn, shared by the nodes and the legend.
COLORS = {
    "graph-kernel": ("#eef4fb", "#2b6cb0"),
    "library-kernel": ("#fdf0e6", "#c05621"),
    "free-kernel": ("#f5f5f5", "#8a8a8a"),
    "block-input": ("#e6f4ea", "#2f855a"),
    "body-op": ("#ffffff", "#4a5568"),
    "accumulator": ("#fff5d6", "#b7791f"),
    "post-op": ("#f3e8ff", "#6b46c1"),
    "block-output": ("#e0f2f1", "#00796b"),
    "loop-frame": ("#fbfdff", "#7f9cc0"),
}
TEXT = "#1a202c"
MUTED = "#4a5568"
EDGE = "#5a6473"
DIM_NAMES = {1: ("elements",), 2: ("rows", "cols"), 3: ("dim 0", "rows", "cols")}


def render_svg(sg: SGraph, values: Mapping[str, int] | None = None, caption: str = "") -> str:
    """The SVG text of `sg`, with every size also evaluated at `values` (an instantiation's
    symbol values) when given; `caption` is a line under the title (e.g. what the picture shows)."""
    info = sg.info  # validates: only a well-formed sGraph is drawn
    pic = _Picture(sg, dict(values) if values else None)
    head = [_Line(f"sGraph {_show(sg.name, 64)}", "title", bold=True, size=14)]
    if caption:
        head.append(_Line(_show(caption, 160), "caption"))
    if values:
        head.append(_Line("launch parameters: " + ", ".join(f"{k}={v}" for k, v in sorted(values.items())),
                          "params"))
    elif info.symbols:
        cons = dict.fromkeys(str(c.expr) for c in info.constraints if c.kind == "divides" and not c.expr.is_const())
        head.append(_Line(f"symbolic sizes: {', '.join(sorted(info.symbols))}", "params"))
        if cons:
            head.append(_Line("each of " + ", ".join(cons) + " must be an integer", "constraints"))
    return pic.draw(head)


# ---------------------------------------------------------------------------------------------
# Text: every string shown goes through `_show` (what a reader sees) and `_esc` (XML).


def _show(text: str, limit: int = NAME_LIMIT) -> str:
    """`text` as a reader should see it: control, format, separator and unassigned characters
    spelled out as escapes (a name must not hide characters, reorder text or be invalid XML),
    then cut to `limit` characters with an ellipsis."""
    out = "".join(
        (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}")
        if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp") else c
        for c in text
    )
    return out if len(out) <= limit else out[: limit - 1] + "…"


def _esc(text: str) -> str:
    return escape(text, {'"': "&quot;", "'": "&apos;"})


def _width(text: str, size: float = FONT_SIZE) -> float:
    """The drawn width of `text` in the monospace font (wide East Asian characters take two cells)."""
    cells = sum(2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in text)
    return cells * size * CHAR_W


def _num(x: float) -> str:
    """A coordinate, always printed the same way (stable bytes, short files)."""
    r = round(x, 1)
    return str(int(r)) if r == int(r) else f"{r:.1f}"


@dataclass(frozen=True)
class _Line:
    """One line of text of a node: its text, its class (what it says) and its look."""

    text: str
    cls: str
    bold: bool = False
    size: int = FONT_SIZE
    color: str = TEXT


def _lines_width(lines: Sequence[_Line]) -> float:
    return max((_width(ln.text, ln.size) for ln in lines), default=0.0)


def _lines_svg(lines: Sequence[_Line], x: float, y: float, anchor: str = "start") -> list[str]:
    """<text> elements, one a line, the first baseline one line below `y`."""
    out = []
    for i, ln in enumerate(lines):
        weight = ' font-weight="bold"' if ln.bold else ""
        size = f' font-size="{ln.size}"' if ln.size != FONT_SIZE else ""
        anchor_attr = f' text-anchor="{anchor}"' if anchor != "start" else ""
        out.append(f'<text class="{ln.cls}" x="{_num(x)}" y="{_num(y + (i + 1) * LINE_H - 4)}" fill="{ln.color}"'
                   f"{weight}{size}{anchor_attr}>{_esc(ln.text)}</text>")
    return out


# ---------------------------------------------------------------------------------------------
# Layered layout: ranks given, dummy nodes along long edges, barycentre ordering, and
# least-squares horizontal placement under minimum gaps.


@dataclass
class _Node:
    key: str
    w: float
    h: float
    rank: int
    fork: bool = True  # all out-edges leave from one point (one value flows out); else spread
    ports_in: dict[str, float] = field(default_factory=dict)  # edge source -> where it enters, from the centre
    ports_out: dict[str, float] = field(default_factory=dict)  # edge target -> where it leaves, from the centre
    dummy: bool = False
    x: float = 0.0  # centre
    y: float = 0.0  # top


@dataclass
class _Layout:
    nodes: dict[str, _Node]
    routes: list[list[tuple[float, float]]]  # per edge, in the order given: the points it passes
    width: float
    height: float


def _layered(nodes: Sequence[_Node], edges: Sequence[tuple[str, str]], hgap: float, vgap: float) -> _Layout:
    """Place `nodes` in rows by rank (rank 0 on top) and route `edges` (from a lower rank to a
    higher one) through dummy nodes, so no edge passes through a node. Deterministic: ties keep
    the order the nodes and edges were given in."""
    at: dict[str, _Node] = {n.key: n for n in nodes}
    chains: list[list[str]] = []
    for i, (s, t) in enumerate(edges):
        chain = [s]
        for r in range(at[s].rank + 1, at[t].rank):
            key = f"d:{i}:{r}"
            at[key] = _Node(key, 8.0, 0.0, r, dummy=True)
            chain.append(key)
        chains.append([*chain, t])
    ups: dict[str, list[str]] = defaultdict(list)
    downs: dict[str, list[str]] = defaultdict(list)
    offsets: dict[tuple[str, str], tuple[float, float]] = {}  # segment -> its ends' offsets from the centres
    for chain in chains:
        for j, (a, b) in enumerate(pairwise(chain)):
            downs[a].append(b)
            ups[b].append(a)
            offsets[a, b] = (at[a].ports_out.get(chain[-1], 0.0) if j == 0 else 0.0,
                             at[b].ports_in.get(chain[0], 0.0) if j == len(chain) - 2 else 0.0)
    layers: list[list[str]] = [[] for _ in range(max(n.rank for n in at.values()) + 1)]
    for key, n in at.items():
        layers[n.rank].append(key)
    layers = _order(layers, ups, downs, offsets, at)
    _place(layers, at, ups, downs, offsets, hgap)
    _straighten(chains, layers, at, hgap)
    y = 0.0
    for layer in layers:
        h = max((at[k].h for k in layer), default=0.0)
        for k in layer:
            at[k].y = y + (h - at[k].h) / 2 if not at[k].dummy else y
            at[k].h = h if at[k].dummy else at[k].h
        y += h + vgap
    left = min((n.x - n.w / 2 for n in at.values()), default=0.0)
    for n in at.values():
        n.x -= left
    width = max((n.x + n.w / 2 for n in at.values()), default=0.0)
    routes = _routes(chains, at)
    return _Layout({k: n for k, n in at.items() if not n.dummy}, routes, width, max(y - vgap, 0.0))


def _order(layers: list[list[str]], ups: Mapping[str, list[str]], downs: Mapping[str, list[str]],
           offsets: Mapping[tuple[str, str], tuple[float, float]], at: Mapping[str, _Node]) -> list[list[str]]:
    """Barycentre sweeps down and up (nodes on one neighbour ordered by where on it their edges
    meet it); the ordering with the fewest crossings seen wins."""
    best, best_crossings = [list(layer) for layer in layers], _crossings(layers, downs, offsets, at)
    current = [list(layer) for layer in layers]
    for sweep in range(8):
        down = sweep % 2 == 0
        rows = range(1, len(current)) if down else range(len(current) - 2, -1, -1)
        for r in rows:
            pos = {k: i for i, k in enumerate(current[r - 1] if down else current[r + 1])}

            def key(item: tuple[int, str], pos: dict[str, int] = pos, down: bool = down) -> tuple[float, float, int]:
                i, k = item
                segs = [(n, k) for n in ups.get(k, [])] if down else [(k, n) for n in downs.get(k, [])]
                near = [pos[s[0] if down else s[1]] for s in segs]
                port = [offsets[s][0 if down else 1] for s in segs]
                return (sum(near) / len(near), sum(port) / len(port), i) if segs else (i, 0.0, i)

            current[r] = [k for _, k in sorted(enumerate(current[r]), key=key)]
        crossings = _crossings(current, downs, offsets, at)
        if crossings < best_crossings:
            best, best_crossings = [list(layer) for layer in current], crossings
    return best


def _crossings(layers: Sequence[Sequence[str]], downs: Mapping[str, list[str]],
               offsets: Mapping[tuple[str, str], tuple[float, float]], at: Mapping[str, _Node]) -> int:
    """Pairs of segments that cross, their ends ordered by node, then by port on the node. Two
    leaving one node by distinct ports count twice: what a kernel writes should lie below it in
    the order it is written (each tensor's label under its own port)."""
    total = 0
    for upper, lower in pairwise(layers):
        pos = {k: i for i, k in enumerate(lower)}
        segs = [((i, offsets[a, b][0]), (pos[b], offsets[a, b][1])) for i, a in enumerate(upper)
                for b in downs.get(a, [])]
        total += sum(2 if a1[0] == a2[0] and not at[upper[a1[0]]].fork else 1
                     for j, (a1, b1) in enumerate(segs) for a2, b2 in segs[j + 1:]
                     if (a1 < a2 and b1 > b2) or (a1 > a2 and b1 < b2))
    return total


def _place(layers: list[list[str]], at: dict[str, _Node], ups: Mapping[str, list[str]],
           downs: Mapping[str, list[str]], offsets: Mapping[tuple[str, str], tuple[float, float]],
           hgap: float) -> None:
    """Horizontal centres: each node as near as the gaps allow to where its edges would fall
    straight (the mean over its neighbours, port offsets counted)."""

    def above(k: str) -> list[float]:
        return [at[n].x + offsets[n, k][0] - offsets[n, k][1] for n in ups.get(k, [])]

    def below(k: str) -> list[float]:
        return [at[n].x + offsets[k, n][1] - offsets[k, n][0] for n in downs.get(k, [])]

    def sep(a: str, b: str) -> float:
        gap = hgap / 3 if at[a].dummy or at[b].dummy else hgap
        return (at[a].w + at[b].w) / 2 + gap

    for layer in layers:
        x = 0.0
        for i, k in enumerate(layer):
            x += sep(layer[i - 1], k) if i else 0.0
            at[k].x = x
        for k in layer:
            at[k].x -= x / 2
    for sweep in range(10):
        down = sweep % 2 == 0
        rows = range(1, len(layers)) if down else range(len(layers) - 2, -1, -1)
        for r in rows:
            layer = layers[r]
            want = []
            for k in layer:
                near = above(k) if down else below(k)
                if sweep >= 8:  # the last sweeps balance between both sides
                    near += below(k) if down else above(k)
                want.append(sum(near) / len(near) if near else at[k].x)
            for k, x in zip(layer, _pack(layer, want, sep), strict=True):
                at[k].x = x


def _straighten(chains: Sequence[list[str]], layers: Sequence[list[str]], at: dict[str, _Node], hgap: float) -> None:
    """Put each long edge's dummies on one vertical line where their neighbours leave room: a
    long edge then runs straight instead of wavering from layer to layer."""
    where = {k: (r, i) for r, layer in enumerate(layers) for i, k in enumerate(layer)}
    for chain in chains:
        dummies = chain[1:-1]
        if len(dummies) < 2:
            continue

        def fits(x: float, dummies: list[str] = dummies) -> bool:
            for d in dummies:
                r, i = where[d]
                layer = layers[r]
                if i and at[layer[i - 1]].x + (at[layer[i - 1]].w + at[d].w) / 2 + hgap / 3 > x:
                    return False
                if i + 1 < len(layer) and at[layer[i + 1]].x - (at[layer[i + 1]].w + at[d].w) / 2 - hgap / 3 < x:
                    return False
            return True

        xs = [at[d].x for d in dummies]
        x = next((c for c in (sum(xs) / len(xs), xs[0], xs[-1], *xs[1:-1]) if fits(c)), None)
        if x is not None:
            for d in dummies:
                at[d].x = x


def _pack(layer: Sequence[str], want: Sequence[float], sep: Callable[[str, str], float]) -> list[float]:
    """Centres in this order, at least `sep` apart, nearest (least squares) to `want`: blocks of
    touching nodes are merged left to right and each block sits at its members' mean wish."""
    blocks: list[tuple[list[int], list[float], float]] = []  # members, offsets from the first, first's x
    for i in range(len(layer)):
        members, offsets, x = [i], [0.0], want[i]
        while blocks:
            pm, po, px = blocks[-1]
            gap = po[-1] + sep(layer[pm[-1]], layer[members[0]])
            if px + gap <= x + 1e-9:
                break
            blocks.pop()
            members, offsets = pm + members, po + [o + gap for o in offsets]
            x = sum(want[m] - o for m, o in zip(members, offsets, strict=True)) / len(members)
        blocks.append((members, offsets, x))
    out = [0.0] * len(layer)
    for members, offsets, x in blocks:
        for m, o in zip(members, offsets, strict=True):
            out[m] = x + o
    return out


def _routes(chains: Sequence[list[str]], at: Mapping[str, _Node]) -> list[list[tuple[float, float]]]:
    """The points of each edge: out of its source's bottom (one point when the source forks,
    else spread in the order of where the edges go), down through its dummies, into its target's
    top (spread in the order of where they come from)."""
    out_ports: dict[int, float] = {}
    in_ports: dict[int, float] = {}
    by_source: dict[str, list[int]] = defaultdict(list)
    by_target: dict[str, list[int]] = defaultdict(list)
    for i, chain in enumerate(chains):
        by_source[chain[0]].append(i)
        by_target[chain[-1]].append(i)
    for key, idx in by_source.items():
        n = at[key]
        order = sorted(idx, key=lambda i: (at[chains[i][1]].x, i))
        for j, i in enumerate(order):
            given = n.ports_out.get(chains[i][-1])
            out_ports[i] = n.x + given if given is not None else n.x if n.fork else _spread(n, j, len(order))
    for key, idx in by_target.items():
        n = at[key]
        order = sorted(idx, key=lambda i: (at[chains[i][-2]].x, i))
        for j, i in enumerate(order):
            given = n.ports_in.get(chains[i][0])
            in_ports[i] = n.x + given if given is not None else _spread(n, j, len(order))
    routes = []
    for i, chain in enumerate(chains):
        src, dst = at[chain[0]], at[chain[-1]]
        pts = [(out_ports[i], src.y + src.h)]
        for d in chain[1:-1]:
            pts += [(at[d].x, at[d].y), (at[d].x, at[d].y + at[d].h)]
        routes.append([*pts, (in_ports[i], dst.y)])
    return routes


def _spread(n: _Node, j: int, count: int) -> float:
    step = min(PORT_STEP, (n.w - 2 * PAD) / max(count - 1, 1))
    return n.x + (j - (count - 1) / 2) * step


def _path(points: Sequence[tuple[float, float]]) -> str:
    """An SVG path through `points`: straight where it falls vertically, else an S-curve that
    leaves and arrives vertically."""
    (x0, y0), parts = points[0], [f"M{_num(points[0][0])},{_num(points[0][1])}"]
    for x1, y1 in points[1:]:
        if abs(x1 - x0) < 0.05:
            parts.append(f"L{_num(x1)},{_num(y1)}")
        else:
            ym = (y0 + y1) / 2
            parts.append(f"C{_num(x0)},{_num(ym)} {_num(x1)},{_num(ym)} {_num(x1)},{_num(y1)}")
        x0, y0 = x1, y1
    return " ".join(parts)


def _edge_svg(points: Sequence[tuple[float, float]], arrow: bool) -> str:
    marker = ' marker-end="url(#arrow)"' if arrow else ""
    return f'<path class="edge" d="{_path(points)}" fill="none" stroke="{EDGE}" stroke-width="1.2"{marker}/>'


# ---------------------------------------------------------------------------------------------
# What the nodes say.


@dataclass
class _Picture:
    sg: SGraph
    values: dict[str, int] | None
    blocks: dict[str, _Block] = field(default_factory=dict)

    def size(self, s: Size | int) -> str:
        """A size as text: symbolic, and `=value` after it when instantiated."""
        s = Size.of(s)
        return str(s) if s.is_const() or self.values is None else f"{s}={self.value(s)}"

    def value(self, s: Size) -> str:
        """An instantiated size's value alone."""
        v: Fraction = s.evaluate(self.values or {})
        return str(v.numerator if v.denominator == 1 else v)

    def shape(self, shape: Sequence[Size | int]) -> str:
        return "(" + ", ".join(self.size(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"

    def draw(self, head: list[_Line]) -> str:
        """The whole document: title lines, the legend, then the kernel graph."""
        body, width, height = self.kernel_graph()
        legend, legend_h = _legend(max(width, _lines_width(head), 560.0))
        width = max(width, _lines_width(head), 560.0)
        top = MARGIN + len(head) * LINE_H + 8
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_num(width + 2 * MARGIN)}" '
               f'height="{_num(top + legend_h + 16 + height + MARGIN)}" '
               f'viewBox="0 0 {_num(width + 2 * MARGIN)} {_num(top + legend_h + 16 + height + MARGIN)}" '
               f'font-family="{FONT}" font-size="{FONT_SIZE}">',
               "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"7\" "
               f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{EDGE}"/></marker>'
               "</defs>",
               '<rect class="background" width="100%" height="100%" fill="#ffffff"/>',
               '<g class="header">', *_lines_svg(head, MARGIN, MARGIN), "</g>",
               f'<g class="legend" transform="translate({MARGIN},{_num(top)})">', *legend, "</g>",
               f'<g class="kernel-graph" transform="translate({MARGIN},{_num(top + legend_h + 16)})">', *body, "</g>",
               "</svg>"]
        return "\n".join(out) + "\n"

    # -- the kernel graph ------------------------------------------------------------------------

    def kernel_graph(self) -> tuple[list[str], float, float]:
        """Tensors and kernels in alternating layers; a tensor is drawn as its edge's label."""
        sg, info = self.sg, self.sg.info
        rank: dict[str, int] = {t.id: 0 for t in sg.inputs}
        for k in sg.kernels:
            r = max((rank[t] + 1 for t in k.tensor_inputs), default=1)
            rank[f"k:{k.id}"] = r
            for t in k.outputs:
                rank[t] = r + 1
        readers: dict[str, list[str]] = defaultdict(list)
        for k in sg.kernels:
            for t in dict.fromkeys(k.tensor_inputs):
                readers[t].append(k.id)
        for k in sg.kernels:  # a kernel that reads nothing (a constant) sits just above its first reader
            if not k.tensor_inputs and all(readers[t] for t in k.outputs):
                r = min(rank[f"k:{kid}"] for t in k.outputs for kid in readers[t]) - 2
                rank[f"k:{k.id}"] = max(r, 1)
                for t in k.outputs:
                    rank[t] = rank[f"k:{k.id}"] + 1
        nodes: list[_Node] = []
        edges: list[tuple[str, str]] = []
        tensor_lines: dict[str, list[_Line]] = {}
        for t in [*(t.id for t in sg.inputs), *(t for k in sg.kernels for t in k.outputs)]:
            role = self.role(t)
            text = f"{_show(t)} {self.shape(info.shapes[t])} {info.dtypes[t]}"
            tensor_lines[t] = [_Line(text + ("" if role == "intermediate" else f" [{role}]"), "tensor-label",
                                     bold=role != "intermediate")]
            nodes.append(_Node(f"t:{t}", _lines_width(tensor_lines[t]) + 2 * 3, LINE_H + 2, rank[t]))
        kernel_parts: dict[str, tuple[str, list[_Line]]] = {}
        for k in sg.kernels:
            kind = self.kind(k)
            lines = self.kernel_lines(k, kind)
            node = _Node(f"k:{k.id}", _lines_width(lines) + 2 * PAD, len(lines) * LINE_H + 2 * PAD,
                         rank[f"k:{k.id}"], fork=False)
            if isinstance(k, GraphKernel):  # the block graph inside; edges meet the box by its inputs and outputs
                block = self.blocks[k.id] = _Block(self, k)
                node.w, node.h = max(node.w, block.width + 2 * PAD), node.h + block.height + PAD
                for inp in reversed(k.block.inputs):
                    node.ports_in[f"t:{inp.tensor}"] = block.offset(f"n:{inp.id}")
                for j, o in enumerate(k.block.outputs):
                    node.ports_out[f"t:{o.tensor}"] = block.offset(f"o:{j}")
            kernel_parts[k.id] = (kind, lines)
            nodes.append(node)
            edges += [(f"t:{t}", f"k:{k.id}") for t in dict.fromkeys(k.tensor_inputs)]
            edges += [(f"k:{k.id}", f"t:{t}") for t in k.outputs]
        lay = _layered(nodes, edges, hgap=28, vgap=24)
        out = ['<g class="edges">']
        for (s, t), pts in zip(edges, lay.routes, strict=True):
            tensor = s[2:] if s.startswith("t:") else t[2:]
            out.append(f'<g class="tensor-edge" data-tensor="{_esc(_show(tensor, 10**6))}">'
                       f"{_edge_svg(pts, arrow=t.startswith('k:'))}</g>")
        out.append("</g>")
        for i, k in enumerate(sg.kernels):
            kind, lines = kernel_parts[k.id]
            out += self.kernel_svg(i, k, kind, lines, lay.nodes[f"k:{k.id}"])
        for i, t in enumerate(tensor_lines):
            n = lay.nodes[f"t:{t}"]
            out += [f'<g class="tensor {self.role(t)}" id="tensor-{i}" data-name="{_esc(_show(t, 10**6))}">',
                    f"<title>{_esc(_show(t, 10**6))}</title>",
                    f'<rect x="{_num(n.x - n.w / 2)}" y="{_num(n.y)}" width="{_num(n.w)}" height="{_num(n.h)}" '
                    f'rx="3" fill="#ffffff" fill-opacity="0.92"/>',
                    *_lines_svg(tensor_lines[t], n.x, n.y, anchor="middle"), "</g>"]
        return out, lay.width, lay.height

    def role(self, tensor: str) -> str:
        """'input' or 'output' of the sGraph, else 'intermediate'."""
        if self.sg.info.producer[tensor] == "":
            return "input"
        return "output" if tensor in self.sg.outputs else "intermediate"

    def kind(self, k: LibraryKernel | GraphKernel) -> str:
        if isinstance(k, GraphKernel):
            return "graph-kernel"
        return "free-kernel" if is_free(self.sg, k) else "library-kernel"

    def kernel_lines(self, k: LibraryKernel | GraphKernel, kind: str) -> list[_Line]:
        kid = _show(k.id)
        if isinstance(k, LibraryKernel):
            title = {"library-kernel": "library kernel", "free-kernel": "free: no launch"}[kind]
            return [_Line(f"{kid} · {title}", "kernel-title", bold=True),
                    _Line(f"{k.op}{_call(k.inputs, k.attrs)}", "kernel-op")]
        b = k.block
        grid = ", ".join(self.axis(a) for a in b.grid)
        lines = [_Line(f"{kid} · graph-defined kernel", "kernel-title", bold=True),
                 _Line(f"grid {grid} · loop {self.axis(b.loop)}", "grid")]
        if self.values is not None:
            blocks = Size.const(1)
            for a in b.grid:
                blocks = blocks * a.size
            lines.append(_Line(f"{_count(self.value(blocks), 'block')} × "
                               f"{_count(self.value(b.loop.size), 'iteration')}", "launch", color=MUTED))
        return lines

    def axis(self, a: Axis) -> str:
        """`x: gx=4`, or just `gx=4` where the axis is named after its size (as searched ones are)."""
        name = _show(a.name)
        return self.size(a.size) if name == str(a.size) else f"{name}: {self.size(a.size)}"

    def kernel_svg(self, i: int, k: LibraryKernel | GraphKernel, kind: str, lines: list[_Line], n: _Node) -> list[str]:
        fill, stroke = COLORS[kind]
        x0 = n.x - n.w / 2
        shape = {"graph-kernel": 'stroke-width="2"', "library-kernel": 'rx="12" stroke-width="1.5"',
                 "free-kernel": 'rx="12" stroke-width="1.2" stroke-dasharray="5 3"'}[kind]
        out = [f'<g class="kernel {kind}" id="kernel-{i}" data-name="{_esc(_show(k.id, 10**6))}">',
               f"<title>{_esc(_show(k.id, 10**6))}</title>",
               f'<rect x="{_num(x0)}" y="{_num(n.y)}" width="{_num(n.w)}" height="{_num(n.h)}" fill="{fill}" '
               f'stroke="{stroke}" {shape}/>']
        if isinstance(k, GraphKernel):
            head_h = len(lines) * LINE_H + PAD
            out.append(f'<line x1="{_num(x0)}" y1="{_num(n.y + head_h + 1)}" x2="{_num(x0 + n.w)}" '
                       f'y2="{_num(n.y + head_h + 1)}" stroke="{stroke}" stroke-width="1"/>')
            out += _lines_svg(lines, x0 + PAD, n.y + PAD / 2)
            block = self.blocks[k.id]
            bx = x0 + (n.w - block.width) / 2
            out += [f'<g class="block-graph" transform="translate({_num(bx)},{_num(n.y + head_h + PAD)})">',
                    *block.svg(i), "</g>"]
        else:
            out += _lines_svg(lines, n.x, n.y + PAD, anchor="middle")
        return [*out, "</g>"]


def _count(n: str, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == "1" else "s")


def _call(args: Sequence[str], attrs: Mapping[str, Any]) -> str:
    """`(a, b, dim=1)`: an op's operands (their order matters) and attributes."""
    items = [_show(a, 20) for a in args]
    items += [f"{_show(str(k), 20)}={_show(_attr(v), 24)}" for k, v in attrs.items()]
    return "(" + ", ".join(items) + ")"


def _attr(v: Any) -> str:
    return str(list(v)) if isinstance(v, tuple) else str(v)


def _dim(d: int, rank: int) -> str:
    """A data dim in words: rows and cols are the last two dims, others by number."""
    return DIM_NAMES[rank][d] if rank in DIM_NAMES else f"dim {d}"


# ---------------------------------------------------------------------------------------------
# Block graphs.


class _Block:
    """The layout of one graph-defined kernel's block graph: inputs on top, the loop body in a
    frame, the accumulators below it, then post-loop ops and outputs."""

    def __init__(self, pic: _Picture, k: GraphKernel) -> None:
        self.pic, self.k = pic, k
        b = k.block
        self.items: list[tuple[str, str, str, list[_Line]]] = []  # (key, class, name, lines), in drawing order
        rank: dict[str, int] = {}
        edges: list[tuple[str, str]] = []
        for inp in b.inputs:
            rank[f"n:{inp.id}"] = 0
            self.items.append((f"n:{inp.id}", "block-input", inp.id, self.input_lines(inp.id, inp.tensor,
                                                                                      inp.imap, inp.fmap)))
        for op in b.body:
            rank[f"n:{op.id}"] = max((rank[f"n:{a}"] + 1 for a in op.inputs), default=1)
        self.body_rows = max((rank[f"n:{op.id}"] for op in b.body), default=0)
        for acc in b.accumulators:
            rank[f"n:{acc.id}"] = self.body_rows + 1
        for op in b.post:
            rank[f"n:{op.id}"] = max([rank[f"n:{a}"] + 1 for a in op.inputs] + [self.body_rows + 2])
        last = max([rank[f"n:{op.id}"] for op in b.post] + [self.body_rows + 1])
        for j in range(len(b.outputs)):
            rank[f"o:{j}"] = last + 1
        for phase, ops in (("body-op", b.body), ("post-op", b.post)):
            for op in ops:
                self.items.append((f"n:{op.id}", f"block-op {phase}", op.id, self.op_lines(op)))
                edges += [(f"n:{a}", f"n:{op.id}") for a in op.inputs]
        for acc in b.accumulators:
            how = f"{acc.kind}({_show(acc.source)}" + (f", dim={acc.dim})" if acc.dim is not None else ")")
            self.items.append((f"n:{acc.id}", "accumulator", acc.id, [
                _Line(f"{_show(acc.id)} = {how} over {_show(b.loop.name)}", "op-name", bold=True),
                _Line(self.tile(acc.id), "tile", size=SMALL, color=MUTED)]))
            edges.append((f"n:{acc.source}", f"n:{acc.id}"))
        for j, o in enumerate(b.outputs):
            self.items.append((f"o:{j}", "block-output", o.tensor, [
                _Line(f"{_show(o.tensor)} ← {_show(o.source)}", "op-name", bold=True),
                _Line(self.omap_text(o.omap, len(pic.sg.info.shapes[o.tensor])), "map omap", size=SMALL)]))
            edges.append((f"n:{o.source}", f"o:{j}"))
        consumers: dict[str, list[str]] = defaultdict(list)
        for s, t in edges:
            consumers[s].append(t)
        for ops, floor in ((b.body, 1), (b.post, self.body_rows + 2)):  # a constant sits just above its first reader
            for op in ops:
                if not op.inputs and consumers[f"n:{op.id}"]:
                    rank[f"n:{op.id}"] = max(floor, min(rank[t] for t in consumers[f"n:{op.id}"]) - 1)
        nodes = [_Node(key, _lines_width(lines) + 2 * PAD, len(lines) * LINE_H + 2 * PAD, rank[key])
                 for key, _, _, lines in self.items]
        self.lay = _layered(nodes, edges, hgap=14, vgap=22)
        self.top = LINE_H + 4  # room for the loop frame's label
        self.width = max(self.lay.width, _width(self.loop_label()) + 8) + 2 * PAD
        self.height = self.top + self.lay.height + PAD

    def offset(self, key: str) -> float:
        """Where a node of the block graph lies, from the block graph's centre."""
        return self.lay.nodes[key].x + self.origin - self.width / 2

    @property
    def origin(self) -> float:
        """The x of the layout's left edge in the block graph's box (it is centred there)."""
        return PAD + (self.width - 2 * PAD - self.lay.width) / 2

    def tile(self, tid: str) -> str:
        """A tile's shape and where it lives: shared memory in a dtype, or registers."""
        bi = self.pic.sg.info.blocks[self.k.id]
        where = bi.storage.get(tid)
        return f"{self.pic.shape(bi.shapes[tid])} " + (f"smem {where}" if where else "registers")

    def input_lines(self, tid: str, tensor: str, imap: Sequence[int | None], fmap: int | None) -> list[_Line]:
        b = self.k.block
        rank = len(self.pic.sg.info.shapes[tensor])
        split = [f"{_dim(d, rank)} over {self.pic.size(a.size)}" for a, d in zip(b.grid, imap, strict=True)
                 if d is not None]
        shared = [_show(a.name) for a, d in zip(b.grid, imap, strict=True) if d is None]
        if not split:
            grid = "grid: every block reads all of it"
        else:
            grid = "grid: split " + ", ".join(split) + (f"; same for every {', '.join(shared)}" if shared else "")
        if fmap is None:
            loop = "loop: the same tile every iteration"
        else:
            inside = " within the block's part" if fmap in imap else ""
            loop = f"loop: walk {_dim(fmap, rank)} by {self.pic.size(b.loop.size)}{inside}"
        return [_Line(f"{_show(tid)} ← {_show(tensor)}", "op-name", bold=True),
                _Line(grid, "map imap", size=SMALL),
                _Line(loop, "map fmap", size=SMALL),
                _Line(self.tile(tid), "tile", size=SMALL, color=MUTED)]

    def omap_text(self, omap: Sequence[int], rank: int) -> str:
        parts = [f"{_dim(d, rank)} over {self.pic.size(a.size)}" for a, d in zip(self.k.block.grid, omap, strict=True)]
        return "write: split " + ", ".join(parts)

    def op_lines(self, op: BlockOp) -> list[_Line]:
        return [_Line(f"{_show(op.id)} = {op.op}{_call(op.inputs, op.attrs)}", "op-name", bold=True),
                _Line(self.tile(op.id), "tile", size=SMALL, color=MUTED)]

    def loop_label(self) -> str:
        return f"loop {self.pic.axis(self.k.block.loop)} · the tiles of one iteration"

    def svg(self, kernel_index: int) -> list[str]:
        """The block graph's elements, in its own coordinates (the caller translates them)."""
        lay, ox, oy = self.lay, self.origin, self.top
        body_keys = [key for key, _, _, _ in self.items if lay.nodes[key].rank <= self.body_rows]
        bottom = max(lay.nodes[key].y + lay.nodes[key].h for key in body_keys)
        fill, stroke = COLORS["loop-frame"]
        out = [f'<g class="loop-frame"><rect x="0" y="0" width="{_num(self.width)}" height="{_num(oy + bottom + 8)}" '
               f'rx="6" fill="{fill}" stroke="{stroke}" stroke-dasharray="6 3"/>',
               *_lines_svg([_Line(self.loop_label(), "loop-label", size=SMALL, color=stroke)], 6, 0), "</g>",
               '<g class="edges">']
        for pts in lay.routes:
            out.append(_edge_svg([(x + ox, y + oy) for x, y in pts], arrow=True))
        out.append("</g>")
        for j, (key, cls, name, lines) in enumerate(self.items):
            n = lay.nodes[key]
            kind = cls.rpartition(" ")[2]
            fill, stroke = COLORS[kind]
            rx = {"accumulator": 12, "block-input": 0, "block-output": 0}.get(kind, 4)
            x0, y0 = n.x - n.w / 2 + ox, n.y + oy
            out += [f'<g class="{cls}" id="kernel-{kernel_index}-{kind}-{j}" data-name="{_esc(_show(name, 10**6))}">',
                    f"<title>{_esc(_show(name, 10**6))}</title>",
                    f'<rect x="{_num(x0)}" y="{_num(y0)}" width="{_num(n.w)}" height="{_num(n.h)}" rx="{rx}" '
                    f'fill="{fill}" stroke="{stroke}" stroke-width="1.2"/>',
                    *_lines_svg(lines, x0 + PAD, y0 + PAD - 1), "</g>"]
        return out


def _legend(width: float) -> tuple[list[str], float]:
    """Swatches with what they stand for, flowing in rows no wider than the picture."""
    entries = [("graph-kernel", "graph-defined kernel"), ("library-kernel", "library kernel"),
               ("free-kernel", "free: view or constant"), ("block-input", "block input: imap/fmap"),
               ("body-op", "loop-body op"), ("accumulator", "accumulator"), ("post-op", "post-loop op"),
               ("block-output", "block output: omap"), ("loop-frame", "loop")]
    out, x, y = [], 0.0, 0.0
    for kind, label in [*entries, ("tensor", "tensor: name shape dtype")]:
        w = 26 + _width(label, SMALL) + 18
        if x and x + w > width:
            x, y = 0.0, y + LINE_H + 4
        if kind == "tensor":
            out.append(f'<path d="M{_num(x)},{_num(y + 7)} L{_num(x + 20)},{_num(y + 7)}" stroke="{EDGE}" '
                       'stroke-width="1.2" marker-end="url(#arrow)"/>')
        else:
            fill, stroke = COLORS[kind]
            dash = ' stroke-dasharray="4 2"' if kind in ("free-kernel", "loop-frame") else ""
            rx = {"library-kernel": 5, "free-kernel": 5, "accumulator": 6, "body-op": 2, "post-op": 2}.get(kind, 0)
            out.append(f'<rect x="{_num(x)}" y="{_num(y)}" width="20" height="14" rx="{rx}" fill="{fill}" '
                       f'stroke="{stroke}" stroke-width="1.5"{dash}/>')
        out.append(f'<text class="legend-label" x="{_num(x + 26)}" y="{_num(y + 11)}" font-size="{SMALL}" '
                   f'fill="{TEXT}">{_esc(label)}</text>')
        x += w
    return out, y + LINE_H
