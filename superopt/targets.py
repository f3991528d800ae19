"""GPU targets: the datasheet figures the cost model and the instantiation constraints use.

Figures are per NVIDIA datasheets (dense tensor-core throughput, no sparsity). `calibrated`
returns a copy with measured values where a GPU has been timed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Target:
    name: str
    device: str
    dram_bytes_per_s: float
    tensor_flops: float  # dense f16/bf16 tensor-core FLOP/s
    fp32_flops: float  # non-tensor-core FP32 FLOP/s (elementwise work, fp32 matmul fallback)
    sms: int
    smem_per_block: int  # bytes of shared memory one block may use (opt-in maximum)
    smem_per_sm: int
    max_blocks: int  # cap on blocks per graph-defined kernel (search-space bound, as Mirage's 4096)
    launch_overhead_s: float
    threads_per_block: int = 128
    compute_capability: str = "9.0"

    def calibrated(
        self, *, dram_bytes_per_s: float | None = None, tensor_flops: float | None = None,
        launch_overhead_s: float | None = None,
    ) -> Target:
        """A copy with measured bandwidth / peak / launch overhead replacing the datasheet ones."""
        return replace(
            self,
            name=f"{self.name}-calibrated",
            dram_bytes_per_s=dram_bytes_per_s or self.dram_bytes_per_s,
            tensor_flops=tensor_flops or self.tensor_flops,
            launch_overhead_s=launch_overhead_s or self.launch_overhead_s,
        )


TARGETS: dict[str, Target] = {
    "h100": Target("h100", "NVIDIA H100 SXM", 3.35e12, 989e12, 67e12, 132, 227 * 1024, 228 * 1024, 4096, 2e-6),
    "h200": Target("h200", "NVIDIA H200", 4.8e12, 989e12, 67e12, 132, 227 * 1024, 228 * 1024, 4096, 2e-6),
    "a100": Target(
        "a100", "NVIDIA A100 SXM 80GB", 2.04e12, 312e12, 19.5e12, 108, 163 * 1024, 164 * 1024, 4096, 2e-6,
        compute_capability="8.0",
    ),
}


class TargetError(ValueError):
    """A target name that is not one of TARGETS."""


def target(name: str) -> Target:
    try:
        return TARGETS[name.lower()]
    except KeyError:
        raise TargetError(f"unknown target {name!r}; expected one of {', '.join(TARGETS)} or 'auto'") from None


# The cost model's revision: raised with every change to what it estimates (superopt.costmodel), so
# that a winner ranked by an older model answers no request (2: bytes in flight in whole sectors).
MODEL_REVISION = 2


def fingerprint(t: Target) -> str:
    """Identity of a cost-model target in the cache key: its figures and the model's revision (a
    measured GPU has its own, from the runtime: device name, compute capability, CUDA and CuPy
    versions)."""
    return f"costmodel:{t.name}:bw={t.dram_bytes_per_s:.4g}:peak={t.tensor_flops:.4g}:sms={t.sms}:m{MODEL_REVISION}"
