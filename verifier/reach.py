"""What a kernel can compute from the tensors it reads, within the target's e-graph.

A graph kernel builds each tile by one op on earlier tiles, starting from the abstract expressions
of the tensors it reads, and the oracle admits a tile only when its expression is in the target's
saturated e-graph (`Oracle.contains`); a library kernel applies one op the same way. So every
value a kernel can produce lies in the least set of e-classes that holds the classes of its inputs
and constants and is closed under the e-graph's e-nodes (an e-node whose children are in the set
puts its class in) and under the simplifications `oracle.mk` applies while building (a sum over a
sum, a quotient or a sum of sums lands in the class of the rewritten term; a double negation in the
class of what it negates). That set, `Reach.of`, over-approximates what the kernel can compute,
so a program output outside it cannot be computed from those inputs: a sound test, used by the
search to bound the last kernel after a middle kernel before the middle's block graphs are made.

Along with each class comes the set of program dim classes every tile of that value must span
(`oracle` abstract values keep a dim per class; an elementwise op's tile spans its operands'
dims, a reduction drops the class it reduces): the intersection over every way to build it, so a
lower bound of the bytes of any tensor holding it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from superopt.object_cache import BoundedDict
from superopt.ops import Op

Dims = frozenset[int]
REDUCTIONS = (Op.SUM, Op.MAX)
CLOSURES = 1 << 14  # closures kept (a long search asks of many sets of inputs)


class Reach:
    """Closure queries on one saturated e-graph (the hash-cons `Oracle` reads back: e-node key ->
    e-class, where a key is (op, *child classes), (reduction, child class, dim class) or a leaf)."""

    def __init__(self, nodes: Mapping[tuple[Any, ...], str]) -> None:
        self._nodes = dict(nodes)
        # (class, kids, reduced dim class or None) for each e-node a kernel can apply; program
        # input leaves are not among them (a kernel has an input only by reading it).
        self._rules: list[tuple[str, tuple[str, ...], int | None]] = []
        self._reps: dict[str, list[tuple[Any, ...]]] = {}
        for key, cls in self._nodes.items():
            self._reps.setdefault(cls, []).append(key)
            if key[0] in REDUCTIONS:
                self._rules.append((cls, (key[1],), key[2]))
            elif key[0] in ("c", "k"):
                self._rules.append((cls, (), None))  # a constant: a kernel makes it itself
            elif key[0] != "inp":
                self._rules.append((cls, key[1:], None))
        self._const = self._nodes.get(("c",))
        self._edges = self._simplifications()
        self._memo: BoundedDict[frozenset[tuple[str, Dims]], dict[str, Dims]] = BoundedDict(CLOSURES)

    @property
    def classes(self) -> list[str]:
        """Every e-class of the e-graph."""
        return list(self._reps)

    @property
    def rules(self) -> list[tuple[str, tuple[str, ...], int | None]]:
        """(class, operand classes, reduced dim class or None) for each e-node a kernel can apply."""
        return self._rules

    @property
    def edges(self) -> list[tuple[str, str, int | None]]:
        """(class, class the builder's rewrites can make it, reduced dim class or None)."""
        return self._edges

    def of(self, start: Mapping[str, Dims]) -> Mapping[str, Dims]:
        """Every e-class a kernel reading values of these classes (each spanning these dims) can
        compute, with the dims every tensor of that value spans at least."""
        key = frozenset(start.items())
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._closure(start)
        return hit

    def _closure(self, start: Mapping[str, Dims]) -> dict[str, Dims]:
        dims: dict[str, Dims] = {}

        def lower(cls: str, spans: Dims) -> bool:
            if cls not in dims:
                dims[cls] = spans
                return True
            if dims[cls] <= spans:
                return False
            dims[cls] = dims[cls] & spans
            return True

        for cls, spans in start.items():
            lower(cls, spans)
        changed = True
        while changed:  # the e-graphs are small (tens to hundreds of e-nodes): plain rounds
            changed = False
            for cls, kids, reduced in self._rules:
                if all(k in dims for k in kids):
                    spans = frozenset().union(*(dims[k] for k in kids))
                    changed |= lower(cls, spans - {reduced} if reduced is not None else spans)
            for src, dst, reduced in self._edges:
                if src in dims:
                    changed |= lower(dst, dims[src] - {reduced} if reduced is not None else dims[src])
        return dims

    def _simplifications(self) -> list[tuple[str, str, int | None]]:
        """(class, class it can become, dim class reduced or None): where `mk` rewrites a term as
        it builds it. A sum over class c of a term of class X may land in any class of
        `sums[(c, X)]` (the sum distributed over an add, moved inside a quotient, reordered under
        another sum), and a negation of a term of class X in the class it negates."""
        classes = list(self._reps)
        reduced = sorted({key[2] for key in self._nodes if key[0] == Op.SUM})
        sums: dict[tuple[int, str], set[str]] = {(c, x): set() for c in reduced for x in classes}
        changed = True
        while changed:  # least fixpoint: terms are finite even where the e-graph has cycles
            changed = False
            for (c, x), found in sums.items():
                new = set(found)
                if (hit := self._nodes.get((Op.SUM, x, c))) is not None:
                    new.add(hit)
                if x == self._const:
                    new.add(x)
                for rep in self._reps[x]:
                    new |= self._sum_of(rep, c, x, sums)
                if new != found:
                    sums[(c, x)] = new
                    changed = True
        edges: list[tuple[str, str, int | None]] = [(x, y, c) for (c, x), found in sums.items() for y in found]
        edges += [(x, rep[1], None) for x in classes for rep in self._reps[x] if rep[0] == Op.NEG]
        return edges

    def _sum_of(self, rep: tuple[Any, ...], c: int, x: str, sums: Mapping[tuple[int, str], set[str]]) -> set[str]:
        """The classes `mk("sum", c, term)` may give for a term whose top e-node is `rep`."""
        out: set[str] = set()
        if rep[0] == Op.ADD:
            for a in sums[(c, rep[1])]:
                for b in sums[(c, rep[2])]:
                    if a == b == self._const:
                        out.add(a)  # mk folds an add of constants
                    if (hit := self._nodes.get((Op.ADD, a, b))) is not None:
                        out.add(hit)
        elif rep[0] == Op.DIV:
            for a in sums[(c, rep[1])]:
                if rep[2] == self._const:
                    out.add(a)  # mk drops a division by the constant atom
                if (hit := self._nodes.get((Op.DIV, a, rep[2]))) is not None:
                    out.add(hit)
        elif rep[0] == Op.SUM and rep[2] == c:
            out.add(x)
        elif rep[0] == Op.SUM and rep[2] < c:
            for b in sums[(c, rep[1])]:
                if (hit := self._nodes.get((Op.SUM, b, rep[2]))) is not None:
                    out.add(hit)
        return out
