"""The GPU runtime on a machine without one: nothing imports CuPy, and every GPU path says why it
cannot run. (The GPU behaviour itself is in test_runtime_gpu.py, marked `gpu`.)"""

from __future__ import annotations

import subprocess
import sys
import types

import numpy as np
import pytest

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
