"""Host-side tensor encoding: float values as the bytes a device tensor of a dtype holds.

bf16 has no numpy (or CuPy) dtype; its tensors travel as uint16 bit patterns (the upper half of
the float32, rounded to nearest even), which is what a `__nv_bfloat16*` kernel argument reads.
"""

from __future__ import annotations

import numpy as np

from superopt.dtypes import round_bf16

STORAGE = {"f16": np.float16, "bf16": np.uint16, "f32": np.float32}


def encode(values: np.ndarray, dt: str) -> np.ndarray:
    """Values rounded to `dt`, as an array of its storage type (contiguous)."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    if dt == "f16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    if dt == "bf16":
        return (round_bf16(x).view(np.uint32) >> 16).astype(np.uint16)
    return x


def decode(stored: np.ndarray, dt: str) -> np.ndarray:
    """The float64 values of an array of `dt`'s storage type."""
    if dt == "bf16":
        return (np.asarray(stored, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.asarray(stored).astype(np.float64)
