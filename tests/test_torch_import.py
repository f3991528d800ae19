"""PyTorch in: `from_torch` imports modules exactly (float64 reference against PyTorch's float64
output), refuses what the IR cannot say by op and source line, and `superopt.compile` returns
the module's results: eagerly without a GPU, through the kernels on a faked one."""

from __future__ import annotations

import inspect
import logging

import numpy as np
import pytest

pytest.importorskip("torch", reason="the torch extra is not installed (pip install 'superopt[torch]')")

import torch
import torch.nn.functional as F
from fake_device import fake_gpu, no_gpu
from torch import nn
from torch_models import MODELS, example

import superopt
from superopt.codegen import LibraryCall
from superopt.frontends.builder import UnsupportedOp
from superopt.program import ProgramError
from superopt.reference import evaluate


def feeds(imported, model: nn.Module, args: tuple) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    """Each program input's float64 values, from the call's arguments and the module's state."""
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    return {pid: (args[s.index] if s.kind == "argument" else state[s.path]).detach().double().numpy()
            for pid, s in imported.sources.items()}


@pytest.mark.parametrize("name", list(MODELS))
def test_the_imported_program_computes_what_pytorch_computes(name):
    from superopt.frontends.torch_import import import_model

    model, x = example(name)
    imported = import_model(model, (x,))
    assert imported.program.dtype == "f32" and imported.program.nodes["x"].shape == tuple(x.shape)
    got = evaluate(imported.program, feeds(imported, model, (x,)))
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
    assert len(got) == 1 and got[0].shape == want.shape
    assert np.max(np.abs(got[0] - want)) <= 1e-10


def test_parameters_are_inputs_named_by_module_path():
    model, x = example("llama_mlp")
    program = superopt.from_torch(model, (x,))
    assert {n.id for n in program.inputs} == {"x", "gate_proj.weight", "up_proj.weight", "down_proj.weight"}
    assert program.nodes["gate_proj.weight"].shape == (128, 64)
    assert program.name == "LlamaMLP"


def scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return torch.softmax(q @ k.transpose(-1, -2) * 0.25, dim=-1)


def test_a_function_imports_with_its_arguments_as_inputs():
    q, k = torch.randn(2, 8, 16), torch.randn(2, 8, 16)
    program = superopt.from_torch(scores, (q, k))
    assert program.name == "scores" and {n.id for n in program.inputs} == {"q", "k"}
    (got,) = evaluate(program, {"q": q.double().numpy(), "k": k.double().numpy()})
    np.testing.assert_allclose(got, scores(q.double(), k.double()).numpy(), rtol=1e-12, atol=1e-15)


class SiluResidual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return F.silu(self.fc(x)) + residual


def test_one_tensor_given_for_two_arguments_imports_both():
    """forward(x, residual) traced with (x, x) imported as a program of `residual` alone (torch.export
    gives aliased examples one placeholder): 0.63 off for any call with two different tensors."""
    from superopt.frontends.torch_import import import_model

    torch.manual_seed(3)
    model, x = SiluResidual().eval(), torch.randn(4, 32)
    imported = import_model(model, (x, x))
    assert [n.id for n in imported.program.inputs if not n.id.startswith("fc.")] == ["x", "residual"]
    a, r = torch.randn(4, 32), torch.randn(4, 32)
    (got,) = evaluate(imported.program, feeds(imported, model, (a, r)))
    with torch.no_grad():
        want = model.double()(a.double(), r.double()).numpy()
    assert np.max(np.abs(got - want)) <= 1e-10


def test_bf16_and_f16_examples_give_programs_of_their_dtype():
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "f16")):
        model, x = example("rmsnorm_linear", dtype)
        assert superopt.from_torch(model, (x,)).dtype == name


def _line(fn, text: str) -> str:  # type: ignore[no-untyped-def]
    """'file:line' of the line of `fn`'s source that contains `text`."""
    lines, start = inspect.getsourcelines(fn)
    return f"{inspect.getsourcefile(fn)}:{start + next(i for i, s in enumerate(lines) if text in s)}"


class _Tanh(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):  # type: ignore[no-untyped-def]
        return torch.tanh(self.proj(x))


class _ErfGelu(nn.Module):
    def forward(self, x):  # type: ignore[no-untyped-def]
        return F.gelu(x * 2.0)


class _Training(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, x):  # type: ignore[no-untyped-def]
        return self.drop(x) * 2.0


class _Causal(nn.Module):
    def forward(self, x):  # type: ignore[no-untyped-def]
        return F.scaled_dot_product_attention(x, x, x, is_causal=True)


@pytest.mark.parametrize(("module", "op", "line", "why"), [
    (_Tanh, "aten.tanh", "torch.tanh", "superopt has no such op (docs/models.md lists what is imported)"),
    (_Training, "aten.native_dropout", "self.drop", "dropout in training mode (call model.eval() first)"),
    (_ErfGelu, "aten.gelu", "F.gelu", "erf form; superopt's gelu is the tanh approximation"),
    (_Causal, "aten.scaled_dot_product_attention", "is_causal", "causal attention needs a mask"),
])
def test_an_unsupported_op_is_named_with_its_source_line(module, op, line, why):
    x = torch.randn(2, 4, 8, 16)
    with pytest.raises(UnsupportedOp) as e:
        superopt.from_torch(module(), (x,))
    assert isinstance(e.value, ProgramError)  # so the CLI answers exit 2, the service 422
    assert e.value.op == op and why in e.value.reason
    assert e.value.where is not None and e.value.where.startswith(f"{_line(module.forward, line)} (")
    assert op in str(e.value) and _line(module.forward, line) in str(e.value)


def _max_values(x: torch.Tensor) -> torch.Tensor:
    return torch.max(x, dim=-1).values * 2.0  # (values, indices): the indices unused


def _same_dtype_cast(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32) * 2.0  # a no-op on f32 (transformers' RMSNorm casts so)


def _in_place_on_values(x: torch.Tensor) -> torch.Tensor:
    h = x * 2.0
    h += x
    return h.mul_(0.5).relu_()


def _type_as_itself(x: torch.Tensor) -> torch.Tensor:
    return (x.float() * 2.0).type_as(x)  # Gemma's and Meta's RMSNorm cast so; a no-op on f32


@pytest.mark.parametrize("fn", [_max_values, _same_dtype_cast, _in_place_on_values, _type_as_itself])
def test_forms_pytorch_writes_often_import_exactly(fn):
    """torch.max(x, dim).values (its unused indices refused as 'output 1 is used'), a cast to the
    dtype a tensor has ('no such op aten._assert_tensor_metadata'), in-place ops on values the
    model computed ('no such op aten.add_'): imported, and computing what PyTorch computes."""
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(8))
    program = superopt.from_torch(fn, (x,))
    (got,) = evaluate(program, {"x": x.double().numpy()})
    np.testing.assert_allclose(got, fn(x.double()).numpy(), rtol=1e-12, atol=1e-15)


class _WritesItsInput(nn.Module):
    def forward(self, x):  # type: ignore[no-untyped-def]
        x.mul_(2.0)
        return x + 1.0


def _branches(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0 if x.sum() > 0 else x


def test_what_torch_export_cannot_make_pure_or_capture_is_one_program_error():
    """A write to an input reached 'no such op aten.mul_' (never the message written for it), and
    Python control flow on a tensor's value escaped as torch's own exception."""
    x = torch.randn(4, 64)
    with pytest.raises(ProgramError, match=r"_WritesItsInput: it writes x in place \(USER_INPUT_MUTATION\)"):
        superopt.from_torch(_WritesItsInput(), (x,))
    with pytest.raises(ProgramError, match=r"_branches: torch.export cannot capture it \(GuardOnDataDependentSymNode"):
        superopt.from_torch(_branches, (x,))


def grouped_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Each K head serves two query heads: broadcast over the group (no copy of K)."""
    b, kv, s, d = k.shape
    return torch.softmax(q.view(b, kv, 2, s, d) @ k[:, :, None].transpose(-1, -2), dim=-1)


def repeated_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The same with K's heads repeated (expand, then reshape): a copy the IR cannot say."""
    b, kv, s, d = k.shape
    k = k[:, :, None].expand(b, kv, 2, s, d).reshape(b, kv * 2, s, d)
    return torch.softmax(q.view(b, kv, 2, s, d) @ k.view(b, kv, 2, s, d).transpose(-1, -2), dim=-1)


def test_a_broadcast_imports_where_its_readers_broadcast_and_is_refused_where_it_must_be_copied():
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    program = superopt.from_torch(grouped_scores, (q, k))
    (got,) = evaluate(program, {"q": q.double().numpy(), "k": k.double().numpy()})
    np.testing.assert_allclose(got, grouped_scores(q.double(), k.double()).numpy(), rtol=1e-12, atol=1e-15)
    with pytest.raises(UnsupportedOp) as e:
        superopt.from_torch(repeated_scores, (q, k))
    assert e.value.op == "aten.expand" and "needs the broadcast materialized" in e.value.reason
    assert e.value.where is not None and e.value.where.startswith(f"{_line(repeated_scores, '.expand(')} (")


def test_examples_of_other_dtypes_are_refused():
    model, x = example("rmsnorm_linear")
    with pytest.raises(ProgramError, match=r"example input 0: dtype torch.float64; superopt programs compute f16"):
        superopt.from_torch(model.double(), (x.double(),))


def test_compile_without_a_gpu_runs_eager_and_says_so_once(tmp_path, caplog, monkeypatch):
    no_gpu(monkeypatch)
    model, x = example("llama_mlp")
    with caplog.at_level(logging.WARNING, logger="superopt.torch"):
        compiled = superopt.compile(model, (x,), db=f"sqlite:///{tmp_path / 'cache.db'}")
        again = superopt.compile(model, x, db=f"sqlite:///{tmp_path / 'cache.db'}")
    assert compiled.path.kernels is None and compiled.result is None
    assert compiled.reason == "no GPU (CuPy finds no CUDA device)"
    assert [r.message for r in caplog.records].count(f"superopt runs torch eager: {compiled.reason}") == 1
    assert inspect.signature(compiled) == inspect.signature(model.forward)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)
        torch.testing.assert_close(again(x=x), model(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"argument 'x': \(8, 64\) torch.float32; LlamaMLP was compiled for \(16, 64\)"):
        compiled(x[:8])


class _Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 64, generator=torch.Generator().manual_seed(5)) / 8)

    def forward(self, x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        return (x @ self.w) * scale


@pytest.mark.parametrize("device", ["gpu", "no gpu"])
def test_a_call_setting_an_argument_the_examples_did_not_give_is_refused(tmp_path, monkeypatch, device):
    """forward(x, scale=2.0) compiled from (x,): the program was traced with scale 2, and a call
    with scale 3 ran the kernels anyway (the answer for 2, on the kernel path). Refused, on every
    path alike; the traced call runs."""
    (fake_gpu if device == "gpu" else no_gpu)(monkeypatch)
    model = _Scaled()
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(6))
    compiled = superopt.compile(model, (x,), search=True, target="h100", budget_s=60,
                                db=f"sqlite:///{tmp_path / 'cache.db'}")
    assert (compiled.path.kernels is not None) == (device == "gpu")  # on a GPU the kernels would run
    for call in (lambda: compiled(x, 3.0), lambda: compiled(x, scale=0.0)):
        with pytest.raises(TypeError, match=r"_Scaled was compiled for 1 tensor arguments, got 2 \('scale' too: "
                                            r"the program was traced with their defaults"):
            call()
    if device == "no gpu":  # the traced call runs (eager here: no GPU), the default given or not
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
            torch.testing.assert_close(compiled(x, scale=2.0), model(x))
            torch.testing.assert_close(compiled(x, 2.0), model(x))
    with pytest.raises(TypeError, match=r"got 2 \('scale' too"):
        compiled(x, scale=2)  # an int where the default is a float: not the traced call


def test_on_a_gpu_compile_runs_the_proved_kernels_on_the_callers_tensors(tmp_path, monkeypatch):
    """The searched, proved winner runs on the caller's tensors: the device program's input
    buffers are the argument and the module's parameters themselves (a transposed weight is a
    view of the parameter), and the returned tensor is the buffer its kernel wrote."""
    import superopt.frontends.kernels as kernels

    fake_gpu(monkeypatch)
    seen: list[dict[str, np.ndarray]] = []

    def run(self):  # type: ignore[no-untyped-def]  # the kernels' work, done by the reference
        seen.append(dict(self.buffers))
        outs = evaluate(compiled.program, {n: self.buffers[n] for n in self.prog.inputs}, exact=False)
        for name, value in zip(self.prog.outputs, outs, strict=True):
            self.buffers[name][...] = value

    monkeypatch.setattr(kernels.TorchKernels, "run", run)
    model, x = example("rmsnorm_linear")
    compiled = superopt.compile(model, (x,), search=True, target="h100", budget_s=60,
                                db=f"sqlite:///{tmp_path / 'cache.db'}")
    assert compiled.reason == "" and compiled.result is not None
    assert compiled.result.best.verdict is not None and compiled.result.best.verdict.proved
    device = compiled.path.kernels
    assert device is not None and len(device.prog.launches) >= 1
    with torch.no_grad():
        y = compiled(x)
        torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-5)
    buffers = seen[0]
    assert np.shares_memory(buffers["x"], x.numpy())
    for name, p in model.named_parameters():
        assert np.shares_memory(buffers[name], p.detach().numpy()), name
    views = [s.output for s in device.prog.steps if isinstance(s, LibraryCall) and s.op == "transpose"]
    weight = dict(model.named_parameters())["proj.weight"].detach().numpy()
    assert views and all(np.shares_memory(buffers[v], weight) for v in views)
    assert np.shares_memory(buffers[device.prog.outputs[0]], y.numpy())
    x2 = torch.randn_like(x)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x2), model(x2), rtol=1e-5, atol=1e-5)
    assert np.shares_memory(seen[1]["x"], x2.numpy())  # each call binds its own arguments
