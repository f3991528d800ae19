"""A Llama-style decoder block brought to superopt: imported from PyTorch, optimized, and called.

    .venv/bin/python examples/llama_block.py

The block (RMSNorm, Q/K/V projections, grouped-query attention, output projection, residual,
RMSNorm, gated MLP, residual) is an ordinary `nn.Module`. `superopt.compile` imports it as one
program, searches its fused kernels within a small budget, proves them and caches them; the
returned callable has the module's signature. On a GPU it runs the proved kernels on the
caller's tensors; without one it runs the module eagerly and says so.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F
from torch import nn

import superopt


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # each K/V head serves 2 query heads
        return self.o_proj(y.transpose(1, 2).reshape(b, s, d))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4, kv_heads: int = 2, hidden: int = 128) -> None:
        super().__init__()
        self.input_norm = nn.RMSNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads, kv_heads)
        self.post_norm = nn.RMSNorm(dim, eps=1e-6)
        self.mlp = MLP(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.input_norm(x))
        return h + self.mlp(self.post_norm(h))


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("superopt.torch").setLevel(logging.INFO)
    torch.manual_seed(0)
    gpu = torch.cuda.is_available()
    device, dtype = ("cuda", torch.float16) if gpu else ("cpu", torch.float32)
    block = LlamaBlock().eval().to(device, dtype)
    x = torch.randn(1, 16, 64, device=device, dtype=dtype)

    t0 = time.monotonic()
    program = superopt.from_torch(block, (x,))
    print(f"imported {program.summary()}: {len(program.nodes)} nodes, hash {program.canonical_hash()[:16]} "
          f"({time.monotonic() - t0:.1f} s)")

    t0 = time.monotonic()
    # A small budget: 3000 search states (about 15 s on two busy CPU cores), a minute at most.
    compiled = superopt.compile(block, (x,), search=True, max_states=3000, budget_s=60)
    print(f"optimized in {time.monotonic() - t0:.1f} s: {compiled.path.describe()}")
    print(f"runs: {'proved kernels' if compiled.path.kernels else 'torch eager (' + compiled.reason + ')'}")

    with torch.no_grad():
        got, want = compiled(x), block(x)
    err = ((got - want).abs().max() / want.abs().max()).item()
    print(f"output {tuple(got.shape)} {got.dtype}, max relative difference from the module: {err:.2e}")


if __name__ == "__main__":
    main()
