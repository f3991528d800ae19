"""The `Op` enum: every op has a spec, a definition and (elementwise) a C formula and a FLOP
count; the groups partition the ops; programs read and write the same JSON text as before."""

from __future__ import annotations

import json

import pytest

from superopt import costmodel, ops
from superopt.codegen import prelude
from superopt.ops import BINARY, ELEMENTWISE, LAYOUT, NORMALIZE, OPS, REDUCE, UNARY, Op
from superopt.primitives import DEFINITIONS
from superopt.program import Program
from superopt.sgraph import ACCUMULATORS, AccKind, Accumulator, BlockOp, LibraryKernel


def test_every_op_has_a_spec_named_by_it():
    assert set(OPS) == set(Op)
    assert all(OPS[op].name is op for op in Op)


def test_groups_partition_the_ops():
    groups = [UNARY, BINARY, REDUCE, NORMALIZE, LAYOUT, (Op.CONST, Op.MATMUL)]
    members = [op for g in groups for op in g]
    assert len(members) == len(set(members)) and set(members) == set(Op)
    assert set(UNARY) | set(BINARY) == ELEMENTWISE
    assert all(OPS[op].arity == 1 for op in (*UNARY, *REDUCE, *NORMALIZE, *LAYOUT))
    assert all(OPS[op].arity == 2 for op in BINARY)
    assert {op for op in Op if not OPS[op].block_level} == set(LAYOUT)


def test_tables_that_must_be_total_are():
    assert set(DEFINITIONS) == set(Op)
    assert set(prelude.UNARY) | set(prelude.BINARY) == ELEMENTWISE
    assert set(costmodel.ELEMENT_FLOPS) == ELEMENTWISE | {Op.CONST}
    assert set(costmodel.REDUCE_FLOPS) == set(REDUCE) | set(NORMALIZE)


def test_members_are_their_json_strings():
    assert Op.ADD == "add" and hash(Op.ADD) == hash("add") and Op("rms_norm") is Op.RMS_NORM
    assert json.dumps([Op.ADD, {Op.MUL: 1}]) == '["add", {"mul": 1}]'
    assert f"{Op.SOFTMAX}" == str(Op.SOFTMAX) == "softmax"
    assert repr(Op.EXP) == "'exp'"  # messages and digests of reprs read as they did with strings


def test_a_misspelt_member_is_an_error():
    with pytest.raises(AttributeError):
        Op.MATMLU  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(ops.OpError, match="unknown op 'matmlu'"):
        ops.spec("matmlu")


def test_program_json_round_trip_holds_plain_strings():
    p = Program("p")
    x = p.input("X", (4, 8), "f32")
    p.output(p.softmax(p.exp(x) * 2.0))
    text = p.dumps()
    q = Program.loads(text)
    assert q.dumps() == text and q.canonical_hash() == p.canonical_hash()
    assert all(type(n.op) is Op for n in q.nodes.values() if n.op != "input")
    assert all(type(e["op"]) is str for e in json.loads(text)["nodes"])
    assert '"op": "softmax"' in text


def test_kernel_ops_become_members_and_unknown_names_stay_strings():
    assert type(LibraryKernel("k", "exp", ("A",), {}, "B").op) is Op
    assert type(BlockOp("b", "exp", ("a",)).op) is Op
    assert BlockOp("b", "conv", ("a",)).op == "conv"  # for `analyze` to report by name


def test_accumulator_kinds_become_members():
    assert ACCUMULATORS == ("sum", "mean", "concat") and ", ".join(ACCUMULATORS) == "sum, mean, concat"
    assert type(Accumulator("a", "x", "mean").kind) is AccKind
    assert Accumulator("a", "x", "max").kind == "max"  # not a kind: `analyze` names it
