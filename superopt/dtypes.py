"""Element types of tensors: names, byte sizes, rounding and float-check tolerances.

numpy has no bfloat16, so bf16 values live in float32 arrays rounded to bf16 precision
(round to nearest even on the upper 16 bits), which is what the hardware stores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    nbytes: int
    # Normwise relative error allowed between a computation in this dtype and the float64
    # reference: max|out - ref| / max|ref|. Loose enough for fp32 accumulation over thousands
    # of terms with operands rounded to the dtype, tight enough that a wrong tile shows.
    tolerance: float
    largest: float  # the largest finite magnitude it holds

    def round(self, x: np.ndarray) -> np.ndarray:
        """Round float values to what this dtype can store, returned as float32 (or float64)."""
        if self.name == "f16":
            with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf is the point
                return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)
        if self.name == "bf16":
            return round_bf16(np.asarray(x, dtype=np.float32))
        if self.name == "f32":
            return np.asarray(x, dtype=np.float32)
        return np.asarray(x, dtype=np.float64)


DTYPES: dict[str, DType] = {
    "f16": DType("f16", 2, 1e-2, float(np.finfo(np.float16).max)),
    "bf16": DType("bf16", 2, 4e-2, 3.3895313892515355e38),  # (2 - 2**-7) * 2**127
    "f32": DType("f32", 4, 1e-4, float(np.finfo(np.float32).max)),
}


def dtype(name: str) -> DType:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}") from None


def round_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 precision (nearest even), keeping float32 storage."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    out = ((bits + rounding) & np.uint32(0xFFFF0000)).view(np.float32)
    # NaN stays NaN (the add above could carry a NaN payload into infinity).
    return np.where(np.isnan(x), x, out)
