"""Small programs whose kernels take the search's less common shapes, shared by the verifier,
CPU-harness and GPU tests: outputs split side by side, one block, a reduction over a transposed
dim."""

from __future__ import annotations

from superopt import Program
from superopt.build import SGraphBuilder
from superopt.config import SearchConfig
from superopt.search.kernel import KernelSearch
from superopt.search.space import space_of
from superopt.sgraph import SGraph
from superopt.verifier.oracle import Oracle


def attention_block(s: int, d: int, heads: int) -> Program:
    """Multi-head attention as a model writes it: Q, K and V projections of one X, split into
    heads by a reshape and a transpose, attention per head, heads merged, the output projection."""
    dh = d // heads
    p = Program("attention_block")
    x = p.input("X", (s, d), "f16")
    wq, wk, wv, wo = (p.input(w, (d, d), "f16") for w in ("Wq", "Wk", "Wv", "Wo"))
    q = p.transpose(p.reshape(x @ wq, (s, heads, dh)), (1, 0, 2)) * (1.0 / dh**0.5)
    k = p.transpose(p.reshape(x @ wk, (s, heads, dh)), (1, 2, 0))
    v = p.transpose(p.reshape(x @ wv, (s, heads, dh)), (1, 0, 2))
    e = p.exp(q @ k)
    o = p.reshape(p.transpose((e / p.sum(e, -1, keepdim=True)) @ v, (1, 0, 2)), (s, d))
    p.output(p.op("matmul", o, wo, name="O"))
    return p


def reshaped_view(shape: tuple[int, ...], perm: tuple[int, ...], reshaped: tuple[int, int], cols: int) -> Program:
    """reshape(transpose(exp(A), perm)) @ W: a reshape of a transposed view read by a product."""
    p = Program("reshaped_view")
    a, w = p.input("A", shape, "f16"), p.input("W", (reshaped[1], cols), "f16")
    p.output(p.op("matmul", p.reshape(p.transpose(p.exp(a), perm), reshaped), w, name="O"))
    return p


def merged_heads(heads: int = 2, rows: int = 16, head_dim: int = 32, cols: int = 48) -> Program:
    """Heads merged after a per-head op, as attention's output projection reads them."""
    return reshaped_view((heads, rows, head_dim), (1, 0, 2), (rows, heads * head_dim), cols)


def reshaped_view_sgraph(program: Program, returned: bool = False) -> SGraph:
    """`reshaped_view` as two graph kernels around the transpose and the reshape, which the
    second reads (and, with `returned`, that the graph returns too: then a copy)."""
    transpose, reshape = (n for n in program.topological() if n.op in ("transpose", "reshape"))
    b = SGraphBuilder.for_program(program, "reshaped_view")
    k = b.graph(grid=[("h", "hx"), ("r", "rx")], loop=("e", 1))
    k.output(k.acc(k.op("exp", k.input("A", [0, 1], None))), "E", [0, 1])
    b.library("transpose", "E", out="T", perm=list(transpose.attrs["perm"]))
    b.library("reshape", "T", out="R", shape=list(reshape.shape))
    k = b.graph(grid=[("x", "gx"), ("y", "gy")], loop=("f", "F"))
    k.output(k.acc(k.op("matmul", k.input("R", [0, None], 1), k.input("W", [None, 1], 0))), "O", [0, 1])
    return b.build(["O", "R"] if returned else ["O"])


def llama_mlp(m: int, d: int, f: int) -> Program:
    """A llama MLP block with its residual: X + (silu(Xn @ Wg) * (Xn @ Wu)) @ Wd, Xn = rms_norm(X)."""
    p = Program("llama_mlp")
    x = p.input("X", (m, d), "f16")
    wg, wu = p.input("Wg", (d, f), "f16"), p.input("Wu", (d, f), "f16")
    xn = p.rms_norm(x, -1)
    p.output(p.op("add", x, (p.silu(xn @ wg) * (xn @ wu)) @ p.input("Wd", (f, d), "f16"), name="O"))
    return p


def norm_projections(m: int, d: int, n: int) -> Program:
    """A decoder's first op and the Q, K and V projections of its normalized X: three outputs."""
    p = Program("norm_projections")
    xn = p.rms_norm(p.input("X", (m, d), "f16"), -1)
    for name in ("Q", "K", "V"):
        p.output(p.op("matmul", xn, p.input(f"W{name.lower()}", (d, n), "f16"), name=name))
    return p


def projections() -> Program:
    """Q, K and V projections of one X: independent outputs, fused side by side (one grid axis
    over the columns of all three weights)."""
    p = Program("qkv")
    x = p.input("X", (8, 64), "f16")
    p.output(*[x @ p.input(w, (64, 32), "f16") for w in ("Wq", "Wk", "Wv")])
    return p


def grouped_projections() -> Program:
    """Q, K and V projections of grouped-query attention (K and V narrower than Q): side by side
    too, each weight's tile its width over the axis size."""
    p = Program("qkv_grouped")
    x = p.input("X", (8, 64), "f16")
    p.output(*[x @ p.input(w, (64, width), "f16") for w, width in (("Wq", 64), ("Wk", 16), ("Wv", 16))])
    return p


def norm_then_softmax() -> Program:
    """softmax over rows of an rms_norm over columns: no dim left for a grid axis to split."""
    p = Program("norm_softmax")
    p.output(p.softmax(p.rms_norm(p.input("X", (16, 32), "f16"), 0), 1))
    return p


def total() -> Program:
    """sum(exp(X)) over both dims: one block walks X."""
    p = Program("total")
    p.output(p.sum(p.sum(p.exp(p.input("X", (16, 32), "f16")), 0, keepdim=True), 1, keepdim=True))
    return p


def softmax_of_transposed() -> Program:
    """A softmax over the rows of a transposed product: over the product's columns, then a view."""
    p = Program("softmax_t")
    p.output(p.softmax(p.transpose(p.input("X", (16, 64), "f32") @ p.input("W", (64, 32), "f32"), (1, 0)), -1))
    return p


def candidate(program: Program, kinds: list[str]) -> SGraph:
    """The first candidate, of a search with no time bound, whose kernels are of these kinds
    ("graph" or "library"): the kernel shape to check, whichever the cost model would pick."""
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(max_kernel_ops=len(kinds)))
    return next(sg for sg in ks.candidates() if [k.kind for k in sg.kernels] == kinds)
