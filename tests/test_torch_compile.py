"""The torch.compile backend "superopt": maximal regions of importable ATen ops become superopt
programs, the ops it cannot import stay PyTorch's, and the model computes what it computed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("torch", reason="the torch extra is not installed (pip install 'superopt[torch]')")

import torch
from fake_device import fake_gpu, no_gpu
from torch import fx, nn
from torch_models import randomized

from superopt.frontends.torch_compile import BACKEND, RegionKernel, SuperoptBackend


class TanhBlock(nn.Module):
    """RMSNorm and a projection, then tanh (which superopt has no op for), then a projection
    and a residual: two importable regions around one op PyTorch keeps."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(64, eps=1e-6)
        self.up = nn.Linear(64, 128, bias=False)
        self.down = nn.Linear(128, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.tanh(self.up(self.norm(x)))) + x


@pytest.fixture
def compiled_graphs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[fx.GraphModule]]:
    """The graphs the backend returns, as they are compiled."""
    graphs: list[fx.GraphModule] = []
    original = SuperoptBackend.compile_graph

    def spy(self, gm, options):  # type: ignore[no-untyped-def]
        graphs.append(original(self, gm, options))
        return graphs[-1]

    monkeypatch.setattr(SuperoptBackend, "compile_graph", spy)
    torch._dynamo.reset()
    yield graphs
    torch._dynamo.reset()


def test_supported_regions_are_replaced_and_the_unsupported_op_runs_eager(compiled_graphs, tmp_path, monkeypatch):
    from torch._dynamo.backends.registry import lookup_backend

    no_gpu(monkeypatch)
    assert lookup_backend("superopt") is BACKEND  # the entry point names the backend
    model = randomized(TanhBlock())
    x = torch.randn(16, 64)
    before = len(BACKEND.regions)
    compiled = torch.compile(model, backend="superopt", options={"db": f"sqlite:///{tmp_path / 'cache.db'}"})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-6, atol=1e-6)
    regions = BACKEND.regions[before:]
    assert len(regions) == 2 and all(r.replaced for r in regions)
    assert all("aten.tanh" not in r.ops for r in regions)
    assert {"aten.mm", "aten.rsqrt"} <= set(regions[0].ops) | set(regions[1].ops)
    assert all(r.runs == "eager" and r.reason.startswith("no GPU") for r in regions)
    (gm,) = compiled_graphs
    kernels = [m for m in gm.modules() if isinstance(m, RegionKernel)]
    assert len(kernels) == 2
    left = [n for n in gm.graph.nodes if n.op == "call_function" and "tanh" in str(n.target)]
    assert len(left) == 1  # tanh is the graph's own, between the regions


def test_on_a_gpu_the_regions_run_their_kernels(compiled_graphs, tmp_path, monkeypatch):
    """Each region's program is searched and its kernels run on the region's arguments (the
    faked device: numpy stands in for CuPy, the reference for the kernels)."""
    import superopt.frontends.kernels as kernels
    from superopt.reference import evaluate

    fake_gpu(monkeypatch)
    ran: list[str] = []

    def run(self):  # type: ignore[no-untyped-def]
        program = next(k.path.program for k in compiled_graphs[0].modules()
                       if isinstance(k, RegionKernel) and k.path.kernels is self)
        ran.append(program.name)
        outs = evaluate(program, {n: self.buffers[n] for n in self.prog.inputs}, exact=False)
        for name, value in zip(self.prog.outputs, outs, strict=True):
            self.buffers[name][...] = value

    monkeypatch.setattr(kernels.TorchKernels, "run", run)
    model = randomized(TanhBlock())
    x = torch.randn(16, 64)
    backend = SuperoptBackend(kernels.SearchOptions(search=True, target="h100", budget_s=60,
                                                    db=f"sqlite:///{tmp_path / 'cache.db'}"))
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(x)
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    assert sorted(ran) == sorted(r.name for r in backend.regions) and len(ran) == 2
    for r in backend.regions:
        assert r.runs == "kernels" and r.reason == "" and r.kernels and r.time_source == "estimated"
        assert r.speedup is not None and 0 < r.speedup < float("inf")
