"""Rules are written with operators on terms and typed side conditions: the notation builds the
very nodes the builders do, and conditions print as the mathematics they state."""

from __future__ import annotations

import pytest

from superopt.verifier import terms as t
from superopt.verifier.rules import RULES_BY_NAME, Indep, Le, Lt, Ne

A, B, S = t.Var("A"), t.Var("B"), t.Var("S")
d, n, a, c = t.DimVar("d"), t.ExtVar("n"), t.AxisVar("a"), t.ConstVar("c")


@pytest.mark.parametrize(("written", "built"), [
    (A + B, t.binary("add", A, B)),
    (A - 2.0, t.binary("sub", A, t.const(2.0))),
    (c - A, t.binary("sub", t.const(c), A)),
    (c / A, t.binary("div", t.const(c), A)),
    (A * 1.0, t.binary("mul", A, t.const(1.0))),
    (-A, t.unary("neg", A)),
    ((A / S.bcast(-1)).matmul(B, n), t.matmul(t.binary("div", A, t.bcast(S, -1)), B, n)),
    (A.part(d, a).sum(d, t.per(n, a)).sum_over(a), t.sum_over(t.reduce("sum", t.part(A, d, a), d, t.per(n, a)), a)),
    (A.reduce("max", d, n), t.reduce("max", A, d)),
    (A.apply("gelu").over("mean_over", a), t.mean_over(t.unary("gelu", A), a)),
    (A.squeeze(d).cat_over(d + 1, a), t.cat_over(t.squeeze(A, d), t.DimVar("d", 1), a)),
])
def test_operators_build_the_nodes_the_builders_do(written, built):
    assert written == built


def test_a_term_is_not_taken_for_a_constant_by_mistake():
    with pytest.raises(TypeError):
        A + "B"  # type: ignore[operator]


def test_conditions_read_as_mathematics():
    conds = [Ne(d, t.DimVar("d2")), Lt(d, t.DimVar("d2")), Le(d, -3), Indep(A, a), Ne(a, t.AxisVar("b"))]
    assert [str(x) for x in conds] == ["d != d2", "d < d2", "d <= -3", "indep(A, a)", "a != b"]
    assert RULES_BY_NAME["cat-commute"].conds == (Ne(t.DimVar("d"), t.DimVar("d2")), Ne(a, t.AxisVar("b")))
