"""A GPU as superopt's torch kernel path sees one, on a machine without: CuPy is numpy (DLPack
shares CPU torch tensors' memory), kernels are never compiled, and the kernel device is the CPU.
What the kernels would compute is left to each test (it replaces `TorchKernels.run`)."""

from __future__ import annotations

import contextlib
import types

import numpy as np
import pytest


def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import superopt.frontends.kernels as kernels
    import superopt.runtime
    import superopt.runtime.executor as executor

    cupy = types.SimpleNamespace(empty=np.empty, uint8=np.uint8, from_dlpack=np.from_dlpack,
                                 cuda=types.SimpleNamespace(ExternalStream=lambda ptr: contextlib.nullcontext()))
    monkeypatch.setattr(superopt.runtime, "gpu_available", lambda: (True, "NVIDIA H200"))
    monkeypatch.setattr(executor, "require_cupy", lambda: cupy)
    monkeypatch.setattr(executor, "kernel_functions", lambda prog: {ln.name: None for ln in prog.launches})
    monkeypatch.setattr(kernels, "KERNEL_DEVICE", "cpu")


def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU, also on a machine with one (and the kernel path has not said so yet)."""
    import superopt.frontends.kernels as kernels
    import superopt.runtime

    monkeypatch.setattr(superopt.runtime, "gpu_available", lambda: (False, "CuPy finds no CUDA device"))
    monkeypatch.setattr(kernels, "_told_no_gpu", False)
