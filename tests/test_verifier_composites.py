"""The prover keeps sigmoid, silu and gelu whole: a long chain of them after a matmul is proved
in a few hundred e-nodes, and a chain that differs in one link is refused."""

from __future__ import annotations

import pytest

from superopt import Program
from superopt.build import BlockBuilder, SGraphBuilder
from superopt.sgraph import SGraph
from superopt.verifier import terms as t
from superopt.verifier.egraph import Limits, ProofResult, prove
from superopt.verifier.lowering import lower_program, lower_sgraph

# A 14-op chain after X @ W with nested gelus (the shape of the generality bench's longest chains);
# a float is a constant scale, "bias" and "residual" add a (1, n) and an (m, n) input.
CHAIN: tuple[str | float, ...] = ("bias", "residual", "silu", "gelu", "gelu", "gelu", "sigmoid", "sigmoid", "relu",
                                  "sigmoid", 0.5, "relu", "sigmoid", 0.7071)
SIDES = {"bias": ("B", (1, 256)), "residual": ("R", (64, 256))}
PROOF_SECONDS = 3.0  # measured about 0.25 s on an idle core
PROOF_ENODES = 5_000  # measured about 300


def _program(chain: tuple[str | float, ...]) -> Program:
    p = Program("gelu_chain")
    y = p.op("matmul", p.input("X", (64, 128), "f32"), p.input("W", (128, 256), "f32"))
    for link in chain:
        if isinstance(link, float):
            y = p.op("mul", y, link)
        elif link in SIDES:
            y = p.op("add", y, p.input(*SIDES[link], "f32"))
        else:
            y = p.op(link, y)
    p.output(y)
    return p


def _fused(p: Program, chain: tuple[str | float, ...]) -> SGraph:
    """One kernel, as the search builds it: the grid over the rows and the columns, the whole
    contraction and the chain in each block."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx"), ("y", "gy")])
    y = k.op("matmul", k.input("X", [0, None], None), k.input("W", [None, 1], None))
    for link in chain:
        y = _link(k, y, link)
    k.output(k.acc(y), p.outputs[0], [0, 1])
    return b.build(list(p.outputs))


def _link(k: BlockBuilder, y: str, link: str | float) -> str:
    if isinstance(link, float):
        return k.op("mul", y, k.op("const", value=link))
    if link in SIDES:
        name, shape = SIDES[link]
        return k.op("add", y, k.input(name, [0 if shape[0] > 1 else None, 1], None))
    return k.op(link, y)


def _proof(program: Program, sgraph: SGraph, limits: Limits | None = None) -> ProofResult:
    rhs, axes = lower_sgraph(sgraph, program)
    return prove(list(zip(lower_program(program), rhs, strict=True)), axes, limits)


def test_a_chain_of_nested_gelus_is_proved_with_the_composites_whole():
    p = _program(CHAIN)
    res = _proof(p, _fused(p, CHAIN))
    assert res.proved and not res.spelled, res.certificate()
    assert res.seconds < PROOF_SECONDS and res.enodes < PROOF_ENODES, res.certificate()


@pytest.mark.parametrize("wrong", [
    (*CHAIN[:10], 0.25, *CHAIN[11:]),  # one constant changed
    (*CHAIN[:4], "silu", *CHAIN[5:]),  # an inner gelu swapped for silu
], ids=["constant", "gelu as silu"])
def test_a_chain_that_differs_in_one_link_is_refused(wrong):
    """Refused with the composites whole, then spelled out, where the chain's products fill any
    node limit (a smaller one refuses sooner)."""
    p = _program(CHAIN)
    res = _proof(p, _fused(p, wrong), Limits(nodes=20_000))
    assert not res.proved and res.spelled, res.certificate()


def test_spelling_out_keeps_shared_operands_shared():
    """gelu names its operand three times: twelve nested gelus spelled out share each level's
    definition (one object), so the terms grow with the depth, not by a factor of three a level."""
    term: t.Term = t.inp("X")
    for _ in range(12):
        term = t.unary("gelu", term)
    (spelled,) = t.spell_out([term])
    seen: dict[int, t.Term] = {}
    stack = [spelled]
    while stack:
        node = stack.pop()
        if id(node) not in seen and isinstance(node, t.Node):
            seen[id(node)] = node
            stack.extend(node.children)
    assert len(seen) < 12 * 20
    assert not any(n.op in t.COMPOSITES for n in seen.values())
