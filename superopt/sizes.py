"""Symbolic integer sizes: the grid sizes, loop ranges and tile shapes of sGraphs.

A `Size` is a Laurent polynomial with rational coefficients over named symbols, kept in a
canonical form (sorted monomials, no zero terms), so equal expressions compare and hash equal:
`Size.parse("4096/(gx*F)") == Size.sym("F").inv() * 4096 / Size.sym("gx")`. Tile shapes are
single monomials (a dimension divided by split factors); sums appear only in resource formulas
such as shared-memory bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property, lru_cache, reduce
from math import lcm
from typing import Any

import numpy as np

Monomial = tuple[tuple[str, int], ...]  # sorted (symbol, nonzero exponent) pairs


class SizeError(ValueError):
    """A size expression that cannot be parsed, divided or evaluated."""


def _mono_mul(a: Monomial, b: Monomial) -> Monomial:
    if not a or not b:  # a constant factor: most products in tile and byte formulas
        return a or b
    exps = dict(a)
    for s, e in b:
        exps[s] = exps.get(s, 0) + e
    return tuple(sorted((s, e) for s, e in exps.items() if e != 0))


def _fraction_const(value: int | Fraction) -> Size:
    value = Fraction(value)
    return Size((((), value),) if value != 0 else ())


_const = lru_cache(maxsize=4096)(_fraction_const)  # integer constants recur (1, dims, byte sizes)


@dataclass(frozen=True)
class Size:
    terms: tuple[tuple[Monomial, Fraction], ...]

    # -- construction -------------------------------------------------------------------
    @staticmethod
    def of(value: Size | int | str) -> Size:
        if isinstance(value, Size):
            return value
        if isinstance(value, bool):
            raise SizeError(f"not a size: {value!r}")
        if isinstance(value, int):
            return Size.const(value)
        if isinstance(value, str):
            return Size.parse(value)
        raise SizeError(f"not a size: {value!r}")

    @staticmethod
    def const(value: int | Fraction) -> Size:
        return _const(value) if isinstance(value, int) else _fraction_const(value)

    @staticmethod
    def sym(name: str) -> Size:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise SizeError(f"bad symbol name {name!r}")
        return Size(((((name, 1),), Fraction(1)),))

    @staticmethod
    def of_terms(terms: Mapping[Monomial, Fraction]) -> Size:
        """The sum of these terms (coefficient by monomial), in canonical form."""
        return Size(tuple(sorted(((m, c) for m, c in terms.items() if c != 0), key=lambda t: t[0])))

    # -- arithmetic ---------------------------------------------------------------------
    def __add__(self, other: Size | int) -> Size:
        return total((self, Size.of(other)))

    __radd__ = __add__

    def __mul__(self, other: Size | int) -> Size:
        other = Size.of(other)
        if len(self.terms) == 1 and len(other.terms) == 1:  # monomials (tile sizes): no merging
            (m1, c1), (m2, c2) = self.terms[0], other.terms[0]
            return Size(((_mono_mul(m1, m2), c1 * c2),))
        acc: dict[Monomial, Fraction] = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                m = _mono_mul(m1, m2)
                acc[m] = acc.get(m, Fraction(0)) + c1 * c2
        return Size.of_terms(acc)

    __rmul__ = __mul__

    def inv(self) -> Size:
        if len(self.terms) != 1:
            raise SizeError(f"cannot divide by the sum {self}")
        m, c = self.terms[0]
        return Size((((tuple((s, -e) for s, e in m)), 1 / c),))

    def __truediv__(self, other: Size | int) -> Size:
        other = Size.of(other)
        if len(self.terms) == 1 and len(other.terms) == 1:  # monomials (tile sizes): one Fraction division
            (m1, c1), (m2, c2) = self.terms[0], other.terms[0]
            return Size(((_mono_mul(m1, tuple((s, -e) for s, e in m2)), c1 / c2),))
        return self * other.inv()

    def __rtruediv__(self, other: Size | int) -> Size:
        return Size.of(other) * self.inv()

    # -- queries --------------------------------------------------------------------------
    @cached_property
    def symbols(self) -> frozenset[str]:
        return frozenset(s for m, _ in self.terms for s, _ in m)

    def is_const(self) -> bool:
        return all(not m for m, _ in self.terms)

    def const_value(self) -> Fraction:
        if not self.is_const():
            raise SizeError(f"{self} is not a constant")
        return self.terms[0][1] if self.terms else Fraction(0)

    def evaluate(self, values: Mapping[str, int]) -> Fraction:
        missing = self.symbols - set(values)
        if missing:
            raise SizeError(f"no value for {', '.join(sorted(missing))} in {self}")
        total = Fraction(0)
        for m, c in self.terms:
            total += c * reduce(lambda acc, se: acc * Fraction(values[se[0]]) ** se[1], m, Fraction(1))
        return total

    def substitute(self, values: Mapping[str, Size | int]) -> Size:
        out = Size.const(0)
        for m, c in self.terms:
            term = Size.const(c)
            for s, e in m:
                base = Size.of(values[s]) if s in values else Size.sym(s)
                for _ in range(abs(e)):
                    term = term * base if e > 0 else term / base
            out = out + term
        return out

    @cached_property
    def _int_terms(self) -> tuple[tuple[Monomial, int, int], ...]:
        return tuple((mono, coeff.numerator, coeff.denominator) for mono, coeff in self.terms)

    def int_value(self, values: Mapping[str, int] | None = None) -> int:
        """The value as an int (exact integer arithmetic; the hot path of instantiation and of
        the cost model, hence the coefficients kept as ints)."""
        values = values or {}
        num, den = 0, 1
        for mono, tn, td in self._int_terms:
            for s, e in mono:
                try:
                    v = values[s]
                except KeyError:
                    raise SizeError(f"no value for {s} in {self}") from None
                if e == 1:
                    tn *= v
                elif e == -1:
                    td *= v
                elif e > 0:
                    tn *= v**e
                else:
                    td *= v ** (-e)
            if td == 1 and den == 1:
                num += tn
            else:
                num, den = num * td + tn * den, den * td
        if num % den:
            raise SizeError(f"{self} = {Fraction(num, den)} is not an integer")
        return num // den

    # -- text ---------------------------------------------------------------------------
    def __str__(self) -> str:
        return self._text

    @cached_property
    def _text(self) -> str:  # kept: kernel texts and constraint messages print the same sizes often
        if not self.terms:
            return "0"
        return " + ".join(_term_str(m, c) for m, c in self.terms)

    def __repr__(self) -> str:
        return f"Size({str(self)!r})"

    @staticmethod
    def parse(text: str) -> Size:
        return _Parser(text).parse()


def _term_str(m: Monomial, c: Fraction) -> str:
    num = [s if e == 1 else f"{s}^{e}" for s, e in m if e > 0]
    den = [s if e == -1 else f"{s}^{-e}" for s, e in m if e < 0]
    if c.numerator != 1 or not num:
        num.insert(0, str(c.numerator))
    if c.denominator != 1:
        den.insert(0, str(c.denominator))
    text = "*".join(num)
    if den:
        text += "/" + (den[0] if len(den) == 1 else "(" + "*".join(den) + ")")
    return text


class _Parser:
    """expr := term ('+' term)* ; term := factor (('*'|'/') factor)* ; factor := atom ('^' int)?"""

    _token = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(.))")

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = [m.group(1) or m.group(2) or m.group(3) for m in self._token.finditer(text)]
        self.tokens = [t for t in self.tokens if t and not t.isspace()]
        self.i = 0

    def fail(self, why: str) -> SizeError:
        return SizeError(f"bad size expression {self.text!r}: {why}")

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise self.fail("unexpected end")
        self.i += 1
        return tok

    def parse(self) -> Size:
        if not self.tokens:
            raise self.fail("empty")
        value = self.expr()
        if self.peek() is not None:
            raise self.fail(f"unexpected {self.peek()!r}")
        return value

    def expr(self) -> Size:
        value = self.term()
        while self.peek() == "+":
            self.take()
            value = value + self.term()
        return value

    def term(self) -> Size:
        value = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            rhs = self.factor()
            value = value * rhs if op == "*" else value / rhs
        return value

    def factor(self) -> Size:
        tok = self.take()
        if tok == "(":
            value = self.expr()
            if self.take() != ")":
                raise self.fail("missing ')'")
        elif tok.isdigit():
            value = Size.const(int(tok))
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", tok):
            value = Size.sym(tok)
        else:
            raise self.fail(f"unexpected {tok!r}")
        if self.peek() == "^":
            self.take()
            exp = self.take()
            if not exp.isdigit():
                raise self.fail("exponent must be a non-negative integer")
            value = reduce(lambda a, _: a * value, range(int(exp) - 1), value) if int(exp) else Size.const(1)
        return value


def compile_sizes(sizes: Sequence[Size]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """One Python function that evaluates all `sizes` at once, exactly, as `int_value` would
    (SizeError on a missing symbol or a fraction), for int values or for numpy int64 arrays of
    values (one element per assignment). The cost model evaluates the same few dozen tile sizes
    for hundreds of thousands of assignments: generated arithmetic over whole columns does that
    without a Python step per assignment. Kept per list of sizes: the first kernels of a search
    are many block graphs over the same tilings, each kernel a new object with the same sizes."""
    return _compiled_sizes(tuple(sizes))


@lru_cache(maxsize=4096)
def _compiled_sizes(sizes: tuple[Size, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    def exact(num: Any, den: Any, i: int) -> Any:
        q, r = divmod(num, den)
        if np.any(r):
            j = int(np.argmax(np.ravel(r) != 0))  # the first assignment that leaves a remainder
            n, d = (int(np.ravel(np.broadcast_to(x, np.shape(r)))[j]) for x in (num, den))
            raise SizeError(f"{sizes[i]} = {Fraction(n, d)} is not an integer")
        return q

    items = [_int_code(size, i) for i, size in enumerate(sizes)]
    return _generate(sizes, f"({''.join(item + ', ' for item in items)})", {"_exact": exact})


@lru_cache(maxsize=8192)  # the same constraints recur across the sGraphs of a search
def compile_ratio(size: Size) -> Callable[[Mapping[str, Any]], tuple[Any, Any]]:
    """`size` as (numerator, denominator) over its least common denominator, for ints or numpy
    columns: exact tests of constraints (an integer when the numerator divides; within a limit
    when the numerator is at most limit x denominator)."""
    num, den = _ratio_code(size)
    return _generate([size], f"({num}, {den})", {})


def _generate(sizes: Sequence[Size], result: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    """def evaluate(v): the symbols of `sizes` as locals `s_<symbol>`, then `result`."""
    symbols = sorted({s for size in sizes for s in size.symbols})
    source = "\n".join([
        "def evaluate(v):",
        "    try:",
        *[f"        s_{s} = v[{s!r}]" for s in symbols],
        "        pass",
        "    except KeyError as e:",
        "        _missing(e.args[0])",
        f"    return {result}",
    ])

    def missing(symbol: str) -> None:
        raise SizeError(f"no value for {symbol} in {', '.join(map(str, sizes))}")

    namespace = {**namespace, "_missing": missing}
    exec(compile(source, "<compile_sizes>", "exec"), namespace)
    return namespace["evaluate"]  # type: ignore[no-any-return]


def _int_code(size: Size, i: int) -> str:
    """Python source for `size` as an int over locals `s_<symbol>`; sizes[i] names it in errors."""
    num, den = _ratio_code(size)
    return num if den == "1" else f"_exact({num}, {den}, {i})"


def _ratio_code(size: Size) -> tuple[str, str]:
    """Source for `size`'s numerator and denominator: the terms over the least common denominator
    that clears all of them, so neither grows far past the value itself."""
    if not size.terms:
        return "0", "1"
    common = lcm(*(c.denominator for _, c in size.terms))
    lowest = {s: max(-e for m, _ in size.terms for t, e in m if t == s) for s in size.symbols}
    lowest = {s: e for s, e in lowest.items() if e > 0}  # symbols some term divides by
    terms = []
    for mono, coeff in size.terms:
        exps = dict(mono)
        factors = [str(coeff.numerator * (common // coeff.denominator))]
        factors += [_power(s, exps.get(s, 0) + lowest.get(s, 0)) for s in sorted({*exps, *lowest})]
        terms.append("*".join(f for f in factors if f))
    den = "*".join([str(common), *(_power(s, e) for s, e in sorted(lowest.items()))])
    return f"({' + '.join(terms)})", den


def _power(symbol: str, exponent: int) -> str:
    return "" if exponent == 0 else f"s_{symbol}" if exponent == 1 else f"s_{symbol}**{exponent}"


def total(sizes: Iterable[Size]) -> Size:
    """The sum of these sizes, its terms collected at once (`+` pair by pair sorts them at every step)."""
    terms: dict[Monomial, Fraction] = {}
    for size in sizes:
        for mono, coeff in size.terms:
            terms[mono] = terms.get(mono, Fraction(0)) + coeff
    return Size.of_terms(terms)


def product(sizes: Iterable[Size | int]) -> Size:
    factors = [Size.of(s) for s in sizes]
    if not all(len(f.terms) == 1 for f in factors):
        return reduce(lambda a, b: a * b, factors, Size.const(1))
    # Monomials (tile shapes, grid sizes): exponents add up, coefficients multiply, one
    # normalization at the end (`__mul__` pair by pair normalizes a Fraction at every step).
    exps: dict[str, int] = {}
    num = den = 1
    for f in factors:
        (mono, c), = f.terms
        num, den = num * c.numerator, den * c.denominator
        for s, e in mono:
            exps[s] = exps.get(s, 0) + e
    return Size(((tuple(sorted((s, e) for s, e in exps.items() if e != 0)), Fraction(num, den)),))
