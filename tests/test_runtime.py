"""The GPU runtime on a machine without one: nothing imports CuPy, every GPU path says why it
cannot run, and the re-ranking of proved candidates by device times is right against a faked
device. (The GPU behaviour itself is in test_runtime_gpu.py, marked `gpu`.)"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from kernel_shapes import merged_heads, reshaped_view_sgraph

from superopt.dtypes import dtype
from superopt.runtime import GpuUnavailable, device_fingerprint, fingerprint_text, gpu_available
from superopt.runtime.device import require_cupy
from superopt.runtime.tensors import STORAGE, decode, encode


def test_importing_superopt_never_imports_cupy():
    code = ("import sys, superopt, superopt.cli, superopt.codegen, superopt.runtime, superopt.runtime.measure, "
            "superopt.runtime.calibrate; assert 'cupy' not in sys.modules, 'cupy imported'")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_without_cupy_every_gpu_path_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    ok, why = gpu_available()
    assert not ok and "CuPy is not installed" in why
    with pytest.raises(GpuUnavailable, match="CuPy is not installed"):
        device_fingerprint()


class _Runtime:
    def __init__(self, count: int | None) -> None:
        self.count = count

    def getDeviceCount(self) -> int:  # CuPy's spelling
        if self.count is None:
            raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
        return self.count


@pytest.mark.parametrize(("count", "message"), [(None, "no usable CUDA device: cudaErrorNoDevice"),
                                                (0, "finds no CUDA device")])
def test_cupy_without_a_device_is_unavailable(monkeypatch, count, message):
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=_Runtime(count)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    with pytest.raises(GpuUnavailable, match=message):
        require_cupy()


def test_fingerprint_text_is_stable():
    fp = {"device": "NVIDIA H200", "compute_capability": "9.0", "cuda_runtime": 13000, "cuda_driver": 13000,
          "cupy": "14.0.0"}
    assert fingerprint_text(fp) == "gpu:NVIDIA H200:sm9.0:cuda13000:driver13000:cupy14.0.0"


@pytest.mark.parametrize("dt", ["f16", "bf16", "f32"])
def test_host_encoding_rounds_to_the_dtype_and_back(dt):
    x = np.random.default_rng(0).standard_normal((3, 5)) * 100
    stored = encode(x, dt)
    assert stored.dtype == STORAGE[dt] and stored.shape == x.shape
    back = decode(stored, dt)
    np.testing.assert_array_equal(back, dtype(dt).round(x).astype(np.float64))
    np.testing.assert_array_equal(decode(encode(back, dt), dt), back)  # exact once rounded
    if dt == "bf16":
        assert stored[0, 0] == np.float32(dtype("bf16").round(x[:1, :1])[0, 0]).view(np.uint32) >> 16



def test_a_local_gpu_re_times_the_contenders_and_never_returns_a_wrong_kernel(monkeypatch, tmp_path):
    """`--target auto` with a GPU: the search proves the best few, each is checked and timed on the
    device, and the fastest correct one wins with its measured time, though the cost model ranked
    it last; one whose kernels are wrong on the device is dropped. The device is faked here (its
    timings and its wrong kernel); the real one is `test_runtime_gpu.py`'s."""
    import superopt.runtime.measure as measure_module
    from superopt import optimize, workloads
    from superopt.runtime.measure import IncorrectKernel, Measurement
    from superopt.search.driver import CONTENDERS

    _fake_h200(monkeypatch, tmp_path)
    program = workloads.resolve("lora:ci")
    timed: list[tuple[str, float]] = []  # (sGraph, faked device time), in the order timed
    wrong: list[str] = []

    def fake_measure(prog, sg, params, target, *args, **kwargs):  # type: ignore[no-untyped-def]
        assert prog is program and target.name == "h200"
        if sg.name.endswith(".unfused"):
            us = 5000.0
        elif not wrong:  # the cost model's favourite is wrong on the device
            wrong.append(sg.dumps())
            raise IncorrectKernel(f"{sg.name}: max relative error 1.0 exceeds the tolerance")
        else:
            us = 1000.0 - 10.0 * len(timed)  # each contender is faster than the one before it
        timed.append((sg.dumps(), us))
        return Measurement(sg.name, us, us - 1.0, 200, 1e-4, 1e-2, len(sg.kernels))

    monkeypatch.setattr(measure_module, "measure", fake_measure)
    db = f"sqlite:///{tmp_path / 'cache.db'}"
    result = optimize(program, target="auto", budget_s=30, db=db)
    report = result.report()
    assert report["target"]["name"] == "h200" and report["target"]["measured"] is True
    assert report["target"]["fingerprint"].startswith("gpu:NVIDIA H200:sm9.0:cuda13000")
    ranked = [c.sgraph.dumps() for c in sorted(result.candidates, key=lambda c: c.estimated_us)
              if not c.sgraph.name.endswith(".unfused")]
    assert len(ranked) == CONTENDERS and ranked[0] == wrong[0]  # the search proved the best few
    assert [s for s, _ in timed] == [*ranked[1:], result.baseline.sgraph.dumps()]  # the wrong one untimed
    assert result.best.sgraph.dumps() == ranked[-1] == timed[-2][0]
    assert report["best"]["time_us"] == timed[-2][1] and report["best"]["time_source"] == "measured"
    assert report["best"]["estimated_us"] == result.best.estimated_us  # the cost model's figure is kept
    assert report["best"]["verdict"]["egraph"] == "proved" and report["best"]["baseline_time_us"] == 5000.0
    assert report["best"]["speedup"] == 5000.0 / timed[-2][1]
    again = optimize(program, target="auto", budget_s=30, db=db)
    assert again.best.sgraph.dumps() == ranked[-1] and again.best.time_us == timed[-2][1]
    assert len(timed) == CONTENDERS  # the cached answer was not timed again


def test_where_every_fused_kernel_is_wrong_on_the_device_the_baseline_is_returned(monkeypatch, tmp_path):
    import superopt.runtime.measure as measure_module
    from superopt import optimize, workloads
    from superopt.api import NoCandidate
    from superopt.runtime.measure import IncorrectKernel, Measurement

    _fake_h200(monkeypatch, tmp_path)
    program = workloads.resolve("rmsnorm_matmul:ci")
    baseline_ok = True

    def fake_measure(prog, sg, params, target, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not (baseline_ok and sg.name.endswith(".unfused")):
            raise IncorrectKernel(f"{sg.name}: max relative error 1.0 exceeds the tolerance")
        return Measurement(sg.name, 7.0, 6.5, 200, 1e-4, 1e-2, len(sg.kernels))

    monkeypatch.setattr(measure_module, "measure", fake_measure)
    result = optimize(program, target="auto", budget_s=30, cache=False)
    assert result.best.sgraph.name.endswith(".unfused") and result.best.time_source == "measured"
    assert result.best.time_us == 7.0 and len(result.candidates) > 1
    baseline_ok = False
    with pytest.raises(NoCandidate, match="no candidate was correct on the device"):
        optimize(program, target="auto", budget_s=30, cache=False)


def _fake_h200(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A local H200 as `resolve_target('auto')` sees one (its name and fingerprint); nothing else
    of it exists, so whatever would run on it must be faked too."""
    import superopt.runtime

    monkeypatch.setenv("SUPEROPT_CACHE_DIR", f"{tmp_path}/cache")
    fingerprint = {"device": "NVIDIA H200", "compute_capability": "9.0", "cuda_runtime": 13000,
                   "cuda_driver": 13000, "cupy": "13.6.0"}
    monkeypatch.setattr(superopt.runtime, "gpu_available", lambda: (True, "NVIDIA H200"))
    monkeypatch.setattr(superopt.runtime, "device_fingerprint", lambda: fingerprint)


@pytest.mark.parametrize("returned", [False, True])
def test_the_device_plan_aliases_views_and_reads_merged_heads_in_place(monkeypatch, returned):
    """The buffers a `DeviceProgram` allocates (numpy stands in for CuPy; nothing runs): a
    transposed view aliases its stored tensor, and so does the reshape of it that only generated
    kernels read (heads merged for a projection): one buffer, no launch, never poisoned. Returned
    too, the reshape is a copy into a buffer of its own, launched like any library kernel."""
    import superopt.runtime.executor as executor
    from superopt.codegen import generate
    from superopt.instantiate import instantiate
    from superopt.targets import TARGETS

    monkeypatch.setattr(executor, "require_cupy", lambda: types.SimpleNamespace(empty=np.empty, uint8=np.uint8))
    monkeypatch.setattr(executor, "kernel_functions", lambda prog: {ln.name: None for ln in prog.launches})
    sg = reshaped_view_sgraph(merged_heads(), returned=returned)
    prog = generate(instantiate(sg, {"hx": 2, "rx": 2, "gx": 2, "gy": 1, "F": 4}, TARGETS["h100"]))
    dev = executor.DeviceProgram(prog)
    assert dev.buffers["T"].base is dev.buffers["E"] and dev.buffers["T"].shape == (16, 2, 32)
    assert (dev.buffers["R"] is dev.buffers["E"]) is not returned
    assert dev.launches == 2 + returned and set(dev.buffers) == {"A", "W", "E", "T", "R", "O"}
    dev.poison()
    assert np.isnan(dev.buffers["O"]).all() and np.isnan(dev.buffers["E"]).all()
    if returned:
        assert dev.buffers["R"].shape == (16, 64) and np.isnan(dev.buffers["R"]).all()
