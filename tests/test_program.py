"""Program IR: building, validation messages, JSON round trip, canonical hash invariants."""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superopt import Program, ProgramError, workloads
from superopt.canonical import canonical_hash


def test_builder_infers_shapes_and_dtypes():
    p = Program("t")
    x = p.input("X", (4, 8), "bf16")
    w = p.input("W", (8, 6), "bf16")
    y = p.rms_norm(x) @ w
    s = p.sum(y, dim=1, keepdim=True)
    z = p.softmax(y / s, dim=-1)
    p.output(z)
    assert y.shape == (4, 6) and s.shape == (4, 1) and z.shape == (4, 6)
    assert z.dtype == "bf16"
    assert p.validate() is p


def test_broadcasting_and_scalars():
    p = Program()
    x = p.input("X", (2, 3, 4), "f32")
    r = p.input("R", (3, 1), "f32")
    y = (x * r + 1.0).node
    assert y.shape == (2, 3, 4)
    assert p.nodes[y.inputs[1]].op == "const"


def _base() -> dict:
    p = Program("base")
    x = p.input("X", (4, 8), "f16")
    w = p.input("W", (8, 6), "f16")
    e = p.op("exp", p.op("matmul", x, w, name="Y"), name="E")
    p.output(p.op("sum", e, name="S", dim=1))
    return p.to_json()


def _mut(fn):
    d = copy.deepcopy(_base())
    fn(d)
    return d


def _node(d, nid):
    return next(n for n in d["nodes"] if n["id"] == nid)


INVALID = [
    ("unknown op", lambda d: _node(d, "E").update(op="tanhh"), "node 'E': unknown op 'tanhh'"),
    ("wrong arity", lambda d: _node(d, "E").update(inputs=["Y", "Y"]), "node 'E' (exp): takes 1 operand(s), got 2"),
    ("matmul inner mismatch", lambda d: _node(d, "W").update(shape=[7, 6]), "node 'Y' (matmul): matmul inner dimensions differ"),
    ("broadcast mismatch", lambda d: d["nodes"].insert(4, {"id": "Z", "op": "add", "inputs": ["Y", "X"]}) or d["outputs"].append("Z"), "node 'Z' (add): shapes (4, 6) and (4, 8) do not broadcast"),
    ("zero dim", lambda d: _node(d, "X").update(shape=[4, 0]), "node 'X' (input): dimension 0 is not positive"),
    ("negative dim", lambda d: _node(d, "X").update(shape=[-4, 8]), "node 'X' (input): dimension -4 is not positive"),
    ("float dim", lambda d: _node(d, "X").update(shape=[4.5, 8]), "node 'X' (input): dimension 4.5 is not an integer"),
    ("bool dim", lambda d: _node(d, "X").update(shape=[True, 8]), "node 'X' (input): dimension true is not an integer"),
    ("scalar input", lambda d: _node(d, "X").update(shape=[]), "node 'X' (input): 'shape' must be a non-empty list of dimensions (a scalar is [1]), got []"),
    ("const as output", lambda d: d["nodes"].append({"id": "C", "op": "const", "attrs": {"value": 2.0}}) or d["outputs"].append("C"), "output 'C' is a constant, not a computed tensor"),
    ("const with a dtype", lambda d: d["nodes"].insert(3, {"id": "C", "op": "const", "attrs": {"value": 2.0}, "dtype": "f16"}), "node 'C': declared dtype 'f16' but the op gives none (a constant takes the dtype of the tensor it meets)"),
    ("unknown dtype", lambda d: _node(d, "X").update(dtype="f8"), "node 'X' (input): unknown dtype 'f8'"),
    ("mixed dtypes", lambda d: _node(d, "W").update(dtype="f32"), "node 'Y' (matmul): operands have different dtypes"),
    ("dangling operand", lambda d: _node(d, "E").update(inputs=["nope"]), "node 'E' (exp): operand 'nope' is not defined"),
    ("cycle", lambda d: _node(d, "Y").update(inputs=["X", "E"]), "cycle through nodes"),
    ("no output", lambda d: d.update(outputs=[]), "has no output"),
    ("unknown output", lambda d: d.update(outputs=["Q"]), "output 'Q' is not a node of the program"),
    ("input as output", lambda d: d.update(outputs=["S", "X"]), "output 'X' is an input, not a computed tensor"),
    ("output twice", lambda d: d.update(outputs=["S", "S"]), "output 'S' is listed twice (each output is one tensor)"),
    ("unknown schema", lambda d: d.update(schema="superopt.program/9"), "unknown program schema 'superopt.program/9'"),
    ("missing schema", lambda d: d.pop("schema"), 'no \'schema\' field (a program file has "schema": "superopt.program/1")'),
    ("duplicate id", lambda d: d["nodes"].append({"id": "E", "op": "neg", "inputs": ["Y"]}), "node 'E': duplicate node id"),
    ("reduce dim out of range", lambda d: _node(d, "S")["attrs"].update(dim=2), "node 'S' (sum): dim 2 is out of range for a rank-2 tensor"),
    ("missing attribute", lambda d: _node(d, "S").update(attrs={}), "node 'S' (sum): missing attribute 'dim'"),
    ("unexpected attribute", lambda d: _node(d, "E").update(attrs={"dim": 1}), "node 'E' (exp): unexpected attribute 'dim'"),
    ("keepdim not bool", lambda d: _node(d, "S")["attrs"].update(keepdim="yes"), "attribute 'keepdim' of sum must be true or false"),
    ("unused input", lambda d: d["nodes"].insert(0, {"id": "U", "op": "input", "shape": [3], "dtype": "f16"}), "input 'U' (input) is not used by any output"),
    ("dead node", lambda d: d["nodes"].append({"id": "D", "op": "neg", "inputs": ["Y"]}), "node 'D' (neg) is not used by any output"),
    ("bad perm", lambda d: d["nodes"].append({"id": "T", "op": "transpose", "inputs": ["Y"], "attrs": {"perm": [0, 0]}}), "node 'T' (transpose): perm [0, 0] is not a permutation"),
    ("reshape count", lambda d: d["nodes"].append({"id": "R", "op": "reshape", "inputs": ["Y"], "attrs": {"shape": [5, 5]}}), "node 'R' (reshape): cannot reshape (4, 6) into (5, 5)"),
    ("eps not positive", lambda d: d["nodes"].append({"id": "N", "op": "rms_norm", "inputs": ["Y"], "attrs": {"eps": 0}}), "attribute 'eps' of rms_norm must be > 0"),
    ("non-finite const", lambda d: d["nodes"].append({"id": "C", "op": "const", "attrs": {"value": float("inf")}}), "attribute 'value' of const must be a finite number"),
    ("matmul rank 1", lambda d: _node(d, "X").update(shape=[8]), "matmul needs operands of rank >= 2"),
    ("matmul of a batch by a matrix", lambda d: _node(d, "X").update(shape=[3, 4, 8]),
     "node 'Y' (matmul): matmul operands must have the same rank, got (3, 4, 8) and (8, 6) (matmul does not "
     "broadcast: reshape a batch into rows to multiply it by one matrix)"),
    ("nodes not a list", lambda d: d.update(nodes={}), "'nodes' must be a non-empty list"),
    ("node not an object", lambda d: d["nodes"].append(3), "nodes[5] must be an object"),
    ("empty id", lambda d: _node(d, "E").update(id=""), "nodes[3]: 'id' '' is not a valid name: a name is 1 to 64 characters"),
    ("declared shape wrong", lambda d: _node(d, "E").update(shape=[9, 9]), "node 'E': declared shape [9, 9] but the op gives [4, 6]"),
    ("unknown field", lambda d: _node(d, "E").update(color="red"), "node 'E': unexpected field 'color'"),
    ("input with attributes", lambda d: _node(d, "X").update(attrs={"foo": 1}), "node 'X' (input): an input has no 'attrs' (its fields are shape and dtype)"),
    ("input with empty attributes", lambda d: _node(d, "X").update(attrs={}), "node 'X' (input): an input has no 'attrs'"),
    ("input with operands", lambda d: _node(d, "X").update(inputs=["X"]), "node 'X' (input): an input has no 'inputs'"),
    ("input with no operands listed", lambda d: _node(d, "X").update(inputs=[]), "node 'X' (input): an input has no 'inputs'"),
    ("dtype not a string", lambda d: _node(d, "X").update(dtype=["f16"]), "node 'X' (input): unknown dtype ['f16']"),
    ("declared shape not a list", lambda d: _node(d, "E").update(shape=5), "node 'E': declared shape 5 but the op gives [4, 6]"),
    ("float attribute beyond float", lambda d: d["nodes"].append({"id": "N", "op": "rms_norm", "inputs": ["Y"], "attrs": {"eps": 10**400}}), "attribute 'eps' of rms_norm must be a finite number"),
    ("too many elements", lambda d: _node(d, "X").update(shape=[4, 2**40]), "node 'X' (input): shape [4, 1099511627776] has 4,398,046,511,104 elements; at most 268,435,456 (SUPEROPT_MAX_TENSOR_ELEMENTS)"),
    ("computed tensor too large", lambda d: (_node(d, "X").update(shape=[2**16, 8]), _node(d, "W").update(shape=[8, 2**16])), "node 'Y' (matmul): shape [65536, 65536] has 4,294,967,296 elements"),
    ("inputs mix dtypes", lambda d: d["nodes"].extend([{"id": "B", "op": "input", "shape": [2], "dtype": "f32"}, {"id": "F", "op": "exp", "inputs": ["B"]}]) or d["outputs"].append("F"), "inputs mix dtypes: 'X' is f16, 'B' is f32"),
    ("too many nodes", lambda d: d["nodes"].extend({"id": f"n{i}", "op": "neg", "inputs": [f"n{i - 1}" if i else "S"]} for i in range(130)) or d.update(outputs=["n129"]), "program 'base' has 135 nodes; at most 128 are searched"),
]


def test_base_program_is_valid():
    assert Program.from_json(_base()).outputs == ["S"]


@pytest.mark.parametrize("case,mutate,message", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_program_is_rejected_with_named_problem(case, mutate, message):
    data = _mut(mutate)
    with pytest.raises(ProgramError) as e:
        Program.from_json(json.loads(json.dumps(data)) if case != "non-finite const" else data)
    assert message in str(e.value), str(e.value)


def test_the_builder_takes_numpy_numbers_as_python_ones():
    """Shapes and constants written with numpy (np.int64 dims, an array of them, np.float32
    scales) were refused ("operand must be a tensor or a number, got float32"): the builder
    takes any integer and any real number, and the program is the one written with Python's."""
    import numpy as np

    def build(dim, shape, scale) -> Program:
        p = Program("scaled")
        x = p.input("X", (dim, 8), "f32")
        p.output(p.op("add", x * scale, p.input("B", shape, "f32"), name="O"))
        return p

    plain = build(4, (4, 8), 0.5)
    assert build(np.int64(4), np.array([4, 8]), np.float32(0.5)).dumps() == plain.dumps()
    with pytest.raises(ProgramError, match="operand must be a tensor or a number, got bool"):
        Program("b").input("X", (4,), "f32") * np.bool_(True)


def test_invalid_json_text():
    with pytest.raises(ProgramError, match="not valid JSON"):
        Program.loads("{nope")


def test_at_least_twenty_distinct_invalid_programs():
    assert len({m for _, _, m in INVALID}) >= 20


# -- random programs for the property tests -------------------------------------------------------

SHAPES = [(2, 3), (3, 4), (2, 4), (4, 4)]
UNARY = ["exp", "neg", "sqrt", "silu", "gelu", "relu", "sigmoid", "square", "rsqrt"]


@st.composite
def programs(draw):
    p = Program("rand")
    dtype = draw(st.sampled_from(["f16", "bf16", "f32"]))
    tensors = []
    for i in range(draw(st.integers(1, 3))):
        tensors.append(p.input(f"in{i}", draw(st.sampled_from(SHAPES)), dtype))
    for _ in range(draw(st.integers(1, 8))):
        a = draw(st.sampled_from(tensors))
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "matmul", "scalar"]))
        if kind == "unary":
            tensors.append(p.op(draw(st.sampled_from(UNARY)), a))
        elif kind == "binary":
            same = [t for t in tensors if t.shape == a.shape]
            tensors.append(p.op(draw(st.sampled_from(["add", "sub", "mul", "div"])), a, draw(st.sampled_from(same))))
        elif kind == "reduce":
            tensors.append(p.op(draw(st.sampled_from(["sum", "mean", "max"])), a, dim=draw(st.integers(0, 1)), keepdim=True))
        elif kind == "matmul":
            fits = [t for t in tensors if len(t.shape) == 2 and t.shape[0] == a.shape[1]]
            if fits:
                tensors.append(p.matmul(a, draw(st.sampled_from(fits))))
        else:
            tensors.append(p.mul(a, draw(st.floats(-3, 3, allow_nan=False).filter(lambda v: v != 0))))
    used = {i for n in p.nodes.values() for i in n.inputs}
    p.outputs = [t.id for t in tensors if t.id not in used and t.node.op != "input"]
    if not p.outputs:
        p.outputs = [p.op("neg", tensors[-1]).id]
    for t in list(tensors):
        if t.node.op == "input" and t.id not in used:
            p.outputs.append(p.op("neg", t).id)
    return p.validate()


def _renamed(data: dict, rng: random.Random) -> dict:
    ids = [n["id"] for n in data["nodes"]]
    new = {i: f"n{rng.randrange(10**9)}_{k}" for k, i in enumerate(ids)}
    out = copy.deepcopy(data)
    for n in out["nodes"]:
        n["id"] = new[n["id"]]
        if "inputs" in n:
            n["inputs"] = [new[i] for i in n["inputs"]]
    out["outputs"] = [new[o] for o in out["outputs"]]
    out["name"] = "renamed"
    return out


def _shuffled(data: dict, rng: random.Random) -> dict:
    """A different insertion order of the same DAG (a random topological order)."""
    nodes = {n["id"]: n for n in data["nodes"]}
    remaining = dict(nodes)
    order = []
    while remaining:
        ready = [i for i, n in remaining.items() if all(x not in remaining for x in n.get("inputs", []))]
        pick = rng.choice(ready)
        order.append(remaining.pop(pick))
    out = copy.deepcopy(data)
    out["nodes"] = copy.deepcopy(order)
    return out


settings.register_profile("superopt", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60)
settings.load_profile("superopt")


@given(programs())
def test_json_round_trip_is_lossless(p):
    q = Program.from_json(json.loads(p.dumps()))
    assert q.to_json() == p.to_json()
    assert q.canonical_hash() == p.canonical_hash()


@given(programs(), st.integers(0, 2**32))
def test_hash_ignores_names_and_insertion_order(p, seed):
    rng = random.Random(seed)
    data = p.to_json()
    assert Program.from_json(_renamed(data, rng)).canonical_hash() == p.canonical_hash()
    assert Program.from_json(_shuffled(data, rng)).canonical_hash() == p.canonical_hash()
    assert Program.from_json(_shuffled(_renamed(data, rng), rng)).canonical_hash() == p.canonical_hash()


def _mutations(data: dict) -> list[tuple[str, dict]]:
    """Changes of op, shape, dtype and wiring that keep the program valid."""
    out = []
    for n in data["nodes"]:
        if n["op"] in UNARY:
            other = "exp" if n["op"] != "exp" else "neg"
            d = copy.deepcopy(data)
            next(m for m in d["nodes"] if m["id"] == n["id"])["op"] = other
            out.append(("op", d))
            break
    for dt in ("f16", "f32"):
        d = copy.deepcopy(data)
        for m in d["nodes"]:
            if m["op"] == "input":
                m["dtype"] = dt
        if d != data:
            out.append(("dtype", d))
            break
    for n in data["nodes"]:
        if n["op"] in ("add", "sub", "mul", "div") and n["inputs"][0] != n["inputs"][1]:
            d = copy.deepcopy(data)
            m = next(m for m in d["nodes"] if m["id"] == n["id"])
            m["inputs"] = [m["inputs"][0], m["inputs"][0]]
            out.append(("edge", d))
            break
    for n in data["nodes"]:
        if n["op"] == "sum" or n["op"] == "mean":
            d = copy.deepcopy(data)
            m = next(m for m in d["nodes"] if m["id"] == n["id"])
            m["op"] = "max"
            out.append(("op", d))
            break
    return out


@given(programs())
def test_hash_changes_with_any_difference(p):
    h = p.canonical_hash()
    for what, data in _mutations(p.to_json()):
        try:
            q = Program.from_json(data)
        except ProgramError:
            continue  # e.g. the rewired operand became unused
        assert q.canonical_hash() != h, what


def test_hash_changes_with_shape_and_constant():
    def build(n: int, c: float) -> Program:
        p = Program()
        x = p.input("X", (n, 8), "f16")
        p.output(p.exp(x) * c)
        return p

    base = build(4, 2.0).canonical_hash()
    assert build(5, 2.0).canonical_hash() != base
    assert build(4, 2.5).canonical_hash() != base
    assert build(4, 2.0).canonical_hash() == base


def test_hash_distinguishes_same_shaped_inputs():
    def build(second: str) -> Program:
        p = Program()
        x = p.input("X", (4, 8), "f16")
        w1 = p.input("W1", (8, 8), "f16")
        w2 = p.input("W2", (8, 8), "f16")
        p.output(p.silu(x @ w1) * (x @ (w2 if second == "W2" else w1)))
        if second != "W2":
            p.output(p.neg(w2))
        return p

    assert build("W2").canonical_hash() != build("W1").canonical_hash()


def test_hash_is_identical_in_a_fresh_process():
    hashes = {name: workloads.resolve(name).canonical_hash() for name in workloads.WORKLOADS}
    code = (
        "import json; from superopt import workloads; "
        "print(json.dumps({n: workloads.resolve(n).canonical_hash() for n in workloads.WORKLOADS}))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": ""})
    assert json.loads(res.stdout) == hashes


def test_canonical_hash_function_matches_method():
    p = workloads.resolve("lora:ci")
    assert canonical_hash(p) == p.canonical_hash()
