"""ONNX in: `import_onnx` (and `superopt import` / `superopt optimize model.onnx`) reads models
written by hand and exported from PyTorch; an export of a module imports to the program PyTorch's
import gives (the same canonical hash), except where the exporter rewrote the weights."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("onnx", reason="the onnx extra is not installed (pip install 'superopt[onnx]')")

import onnx
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from superopt import workloads
from superopt.cli import app
from superopt.frontends.builder import UnsupportedOp
from superopt.frontends.onnx_import import import_onnx
from superopt.program import ProgramError
from superopt.reference import evaluate

RNG = np.random.default_rng(0)
W = RNG.standard_normal((16, 8)).astype(np.float32) / 4  # Gemm(transB=1) keeps it (out, in)
B = RNG.standard_normal(16).astype(np.float32)
SCALE = RNG.standard_normal(16).astype(np.float32)


def mlp_model(last: str = "Softmax") -> onnx.ModelProto:
    """x (4, 8) -> Gemm -> Relu -> LayerNormalization -> Pow 2 -> ReduceMean(axes input) ->
    Reshape (0, -1) via a Shape/Concat computation -> `last`."""
    nodes = [
        helper.make_node("Gemm", ["x", "W", "B"], ["h"], name="fc", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("LayerNormalization", ["r", "scale"], ["n"], name="norm", epsilon=1e-5),
        helper.make_node("Pow", ["n", "two"], ["sq"], name="square"),
        helper.make_node("Add", ["sq", "n"], ["s"], name="add"),
        helper.make_node("ReduceMean", ["s", "axes"], ["m"], name="mean", keepdims=1),
        helper.make_node("Div", ["s", "m"], ["d"], name="div"),
        helper.make_node("Shape", ["d"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "zero"], ["rows"], name="rows", axis=0),
        helper.make_node("Concat", ["rows", "minus_one"], ["target"], name="target", axis=0),
        helper.make_node("Reshape", ["d", "target"], ["flat"], name="reshape"),
        helper.make_node(last, ["flat"], ["y"], name="last"),
    ]
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B"),
             numpy_helper.from_array(SCALE, "scale"), numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def numpy_mlp(x: np.ndarray) -> np.ndarray:
    r = np.maximum(x @ W.T.astype(np.float64) + B, 0)
    n = (r - r.mean(-1, keepdims=True)) / np.sqrt(r.var(-1, keepdims=True) + 1e-5) * SCALE
    s = n * n + n
    d = s / s.mean(-1, keepdims=True)
    e = np.exp(d - d.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_a_hand_written_model_imports_with_initializers_as_inputs():
    program = import_onnx(mlp_model(), "mlp")
    assert {n.id: n.shape for n in program.inputs} == {"x": (4, 8), "W": (16, 8), "B": (16,), "scale": (16,)}
    x = RNG.standard_normal((4, 8))
    (got,) = evaluate(program, {"x": x, "W": W, "B": B, "scale": SCALE})
    np.testing.assert_allclose(got, numpy_mlp(x), rtol=1e-10, atol=1e-12)
    assert not any(n.op == "input" and n.dtype != "f32" for n in program.nodes.values())


def test_an_unsupported_node_is_named(tmp_path):
    path = tmp_path / "tanh.onnx"
    onnx.save(mlp_model("Tanh"), path)
    with pytest.raises(UnsupportedOp) as e:
        import_onnx(path)
    assert isinstance(e.value, ProgramError) and e.value.op == "Tanh"
    assert e.value.where == f"{path}: node 'last'" and "superopt has no such op" in str(e.value)


def test_symbolic_dims_and_integer_inputs_are_refused():
    model = mlp_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    with pytest.raises(ProgramError, match="input 'x': dim batch is symbolic; superopt programs have static shapes"):
        import_onnx(model)
    model = mlp_model()
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
    with pytest.raises(ProgramError, match="input 'x': element type INT64"):
        import_onnx(model)


def test_cli_import_and_optimize_an_onnx_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "cache"))
    runner = CliRunner()
    model, out = tmp_path / "mlp.onnx", tmp_path / "mlp.json"
    onnx.save(mlp_model(), model)
    res = runner.invoke(app, ["import", str(model), "-o", str(out)])
    assert res.exit_code == 0, res.output
    program = import_onnx(model)
    assert program.canonical_hash() in res.stdout and json.loads(out.read_text()) == program.to_json()
    res = runner.invoke(app, ["optimize", str(model), "--budget-s", "2", "--no-cache", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["program"]["hash"] == program.canonical_hash() and report["best"]["verdict"]["egraph"] == "proved"
    # show and check take the model as the other commands do (they read it as JSON: "not UTF-8 text")
    res = runner.invoke(app, ["check", str(model)])
    assert res.exit_code == 0 and res.stdout.split()[0] == program.canonical_hash(), res.output
    res = runner.invoke(app, ["show", str(model)])
    assert res.exit_code == 0 and res.stdout.startswith(f"program {program.name}  hash"), res.output
    onnx.save(mlp_model("Tanh"), tmp_path / "tanh.onnx")
    res = runner.invoke(app, ["import", str(tmp_path / "tanh.onnx")])
    assert res.exit_code == 2 and "unsupported op Tanh at" in res.output and "node 'last'" in res.output


@pytest.mark.parametrize(("name", "text", "why"), [
    ("program.json", None, 'has no field named "schema"'),  # a superopt program, not a model
    ("bad.json", '{"irVersion": "x"}', "Failed to parse irVersion field"),
    ("bad.textproto", "ir_version: x", "ir_version"),
    ("empty.json", "{}", "its graph has no outputs"),
])
def test_a_file_onnx_reads_as_text_that_is_no_model_is_one_error(tmp_path, name, text, why):
    """onnx reads .json and .textproto files with protobuf's text parsers, whose errors are their
    own: `superopt import` printed a traceback (exit 1) for them, and "program 'm' has no output"
    for an empty model. Now one line naming the file, exit 2."""
    path = tmp_path / name
    path.write_text(text if text is not None else workloads.resolve("rmsnorm_matmul:ci").dumps())
    res = CliRunner().invoke(app, ["import", str(path)])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert res.output.startswith(f"error: {path}: not a readable ONNX model: ") and why in res.output, res.output


# -- models exported from PyTorch ----------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_models():  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch", reason="the torch extra is not installed (pip install 'superopt[torch]')")
    pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript (pip install onnxscript)")
    import torch_models

    return torch, torch_models


def export(torch, model, x, path, **options):  # type: ignore[no-untyped-def]
    """torch.onnx.export, quietly (it reports each of its steps)."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(model, (x,), str(path), dynamo=True, verbose=False, **options)


@pytest.mark.parametrize("name", ["llama_mlp", "rmsnorm_linear", "attention", "layernorm_gelu_mlp"])
def test_an_exported_module_imports_to_the_program_pytorch_gives(torch_models, tmp_path, name):
    """Exported unoptimized at opset 23 (which has RMSNormalization and Attention), the ONNX graph
    says what the ATen graph says, and both importers lower it through the same builder."""
    torch, models = torch_models
    from superopt.frontends.torch_import import import_model

    model, x = models.example(name)
    from_torch = import_model(model, (x,)).program
    export(torch, model, x, tmp_path / "m.onnx", optimize=False, opset_version=23)
    program = import_onnx(tmp_path / "m.onnx")
    assert program.canonical_hash() == from_torch.canonical_hash()
    state = {k: v.detach().double().numpy() for k, v in model.named_parameters()}
    (got,) = evaluate(program, {"x": x.double().numpy(), **state})
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
    assert np.max(np.abs(got - want)) <= 1e-10


@pytest.mark.parametrize(("name", "shape", "same"), [
    ("llama_mlp", (2, 8, 64), False),  # 3-D: each weight's transpose folded into a new initializer (in, out)
    ("rmsnorm_linear", (16, 64), False),  # opset 18 has no RMSNormalization: Pow, ReduceMean, Sqrt, ...
])
def test_the_default_export_differs_where_the_exporter_rewrites(torch_models, tmp_path, name, shape, same):
    """torch.onnx.export's defaults (opset 18, graph optimization) may say the computation in
    other words: weights stored transposed (other input tensors) or rms_norm in primitives
    (superopt keeps ops as written). Then the program is another one, with another canonical
    hash (the kernel cache keys them apart), and, fed the exporter's initializers, it still
    computes PyTorch's output."""
    torch, models = torch_models
    import superopt

    model, x = models.example(name, shape=shape)
    from_torch = superopt.from_torch(model, (x,))
    export(torch, model, x, tmp_path / "m.onnx")
    program = import_onnx(tmp_path / "m.onnx")
    assert (program.canonical_hash() == from_torch.canonical_hash()) is same
    if len(shape) == 3:
        weights = {n.id: n.shape for n in program.inputs if n.id != "x"}
        assert not weights.keys() & {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}
        assert sorted(weights.values()) == [(64, 128), (64, 128), (128, 64)]  # (in, out)
        assert not any(n.op == "transpose" for n in program.nodes.values())
    if name == "rmsnorm_linear":
        ops = {n.op for n in program.nodes.values()}
        assert "rms_norm" not in ops and {"square", "mean", "rsqrt"} <= ops
    stored = {i.name: numpy_helper.to_array(i) for i in onnx.load(tmp_path / "m.onnx").graph.initializer}
    (got,) = evaluate(program, {"x": x.double().numpy(), **{n.id: stored[n.id] for n in program.inputs if n.id != "x"}})
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
    assert np.max(np.abs(got - want)) <= 1e-10


def test_grouped_query_attention_before_opset_23_is_refused_at_its_expand(torch_models, tmp_path):
    """Without the Attention op, the exporter repeats each K/V head for its query heads (Expand,
    then Reshape): a materialized broadcast, which the IR cannot say; opset 23 imports."""
    torch, models = torch_models
    model, x = models.example("attention")
    export(torch, model, x, tmp_path / "m.onnx")
    with pytest.raises(UnsupportedOp, match=r"unsupported op Expand at .*: Expand materializes a broadcast") as e:
        import_onnx(tmp_path / "m.onnx")
    assert "opset_version=23" in e.value.reason
