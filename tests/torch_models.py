"""Small PyTorch modules of the kind superopt imports (Llama-style blocks), shared by the import
tests. Their parameters are random (not the layers' ones and zeros), so that a scale or a bias
the importer drops shows in the outputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

D, HIDDEN, HEADS, KV_HEADS = 64, 128, 4, 2


def randomized(module: nn.Module, seed: int = 0) -> nn.Module:
    """`module` in eval mode with every parameter drawn from N(0, 1) / sqrt(fan-in)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / (p.shape[-1] ** 0.5 if p.dim() > 1 else 1.0))
    return module.eval()


class LlamaMLP(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, d: int = D, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class RMSNormLinear(nn.Module):
    def __init__(self, d: int = D, out: int = HIDDEN) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.proj = nn.Linear(d, out, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class Attention(nn.Module):
    """Grouped-query self-attention: Q, K, V projections, softmax(Q K^T / sqrt(d)) V, output projection."""

    def __init__(self, d: int = D, heads: int = HEADS, kv_heads: int = KV_HEADS) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.q_proj = nn.Linear(d, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, d))


class LayerNormGeluMLP(nn.Module):
    """fc2(gelu_tanh(fc1(layer_norm(x))))."""

    def __init__(self, d: int = D, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(self.norm(x)), approximate="tanh"))


MODELS = {"llama_mlp": LlamaMLP, "rmsnorm_linear": RMSNormLinear, "attention": Attention,
          "layernorm_gelu_mlp": LayerNormGeluMLP}


def example(name: str, dtype: torch.dtype = torch.float32,
            shape: tuple[int, ...] | None = None) -> tuple[nn.Module, torch.Tensor]:
    """A randomized model and an example input: (batch 2, seq 8, D) for attention, (16, D) else."""
    model = randomized(MODELS[name]())
    shape = shape or ((2, 8, D) if name == "attention" else (16, D))
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    return model.to(dtype), x.to(dtype)
