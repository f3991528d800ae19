"""The seven LLM blocks Mirage and Prism were measured on, with their best known fused schedules.

Each `program_*` builds the program at given sizes; each `reference_*` writes the hand-made
fused sGraph (DESIGN.md §9) for a program built by its partner, with symbolic grid and loop sizes.
"""

from __future__ import annotations

from superopt.build import BlockBuilder, SGraphBuilder
from superopt.program import Program, Tensor
from superopt.sgraph import SGraph

EPS = 1e-6


def _eps(k: BlockBuilder) -> str:
    return k.after("const", value=EPS)


def _x_and_weights(name: str, n: int, d: int, e: int, dtype: str,
                   *weights: str) -> tuple[Program, Tensor, list[Tensor]]:
    """A program reading X (n x d) and each of `weights` (d x e), in that order: the MLP blocks' inputs."""
    p = Program(name)
    x = p.input("X", (n, d), dtype)
    return p, x, [p.input(w, (d, e), dtype) for w in weights]


# -- rmsnorm_matmul: O = rms_norm(X) @ W ---------------------------------------------------------


def program_rmsnorm_matmul(n: int, d: int, e: int, dtype: str = "f16") -> Program:
    p, x, (w,) = _x_and_weights("rmsnorm_matmul", n, d, e, dtype, "W")
    p.output(p.op("matmul", p.rms_norm(x, -1, EPS), w, name="O"))
    return p


def reference_rmsnorm_matmul(p: Program) -> SGraph:
    """One kernel: the grid splits W's and O's columns, the loop walks the hidden dim; the body
    multiplies tiles and averages squares; after the loop O = acc / sqrt(mean_sq + eps)."""
    b = SGraphBuilder.for_program(p, "rmsnorm_matmul.fused")
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    xt = k.input("X", [None], 1)
    wt = k.input("W", [1], 0)
    prod = k.op("matmul", xt, wt)
    msq = k.op("mean", k.op("square", xt), dim=1, keepdim=True)
    a_prod, a_msq = k.acc(prod, "sum"), k.acc(msq, "mean")
    rms = k.after("sqrt", k.after("add", a_msq, _eps(k)))
    k.output(k.after("div", a_prod, rms), "O", [1])
    return b.build(["O"])


# -- gated_mlp: O = silu(X @ W1) * (X @ W2) ------------------------------------------------------


def program_gated_mlp(n: int, d: int, e: int, dtype: str = "f16") -> Program:
    p, x, (w1, w2) = _x_and_weights("gated_mlp", n, d, e, dtype, "W1", "W2")
    p.output(p.op("mul", p.silu(x @ w1), x @ w2, name="O"))
    return p


def reference_gated_mlp(p: Program) -> SGraph:
    """One kernel: the grid splits W1's and W2's columns, the loop walks K; both matmuls are
    summed over the loop; after it, silu(A1) * A2."""
    b = SGraphBuilder.for_program(p, "gated_mlp.fused")
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    xt = k.input("X", [None], 1)
    a1 = k.acc(k.op("matmul", xt, k.input("W1", [1], 0)))
    a2 = k.acc(k.op("matmul", xt, k.input("W2", [1], 0)))
    k.output(k.after("mul", k.after("silu", a1), a2), "O", [1])
    return b.build(["O"])


# -- rmsnorm_mlp: O = (rms_norm(X) @ Wu) * (rms_norm(X) @ Wg) -------------------------------------


def program_rmsnorm_mlp(n: int, d: int, e: int, dtype: str = "f16") -> Program:
    p, x, (wu, wg) = _x_and_weights("rmsnorm_mlp", n, d, e, dtype, "Wu", "Wg")
    xn = p.rms_norm(x, -1, EPS)
    p.output(p.op("mul", xn @ wu, xn @ wg, name="O"))
    return p


def reference_rmsnorm_mlp(p: Program) -> SGraph:
    """As gated_mlp plus a mean-of-squares accumulator; after the loop (A1 / r) * (A2 / r)."""
    b = SGraphBuilder.for_program(p, "rmsnorm_mlp.fused")
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    xt = k.input("X", [None], 1)
    a1 = k.acc(k.op("matmul", xt, k.input("Wu", [1], 0)))
    a2 = k.acc(k.op("matmul", xt, k.input("Wg", [1], 0)))
    a3 = k.acc(k.op("mean", k.op("square", xt), dim=1, keepdim=True), "mean")
    rms = k.after("sqrt", k.after("add", a3, _eps(k)))
    k.output(k.after("mul", k.after("div", a1, rms), k.after("div", a2, rms)), "O", [1])
    return b.build(["O"])


# -- lora: O = X @ W + (X @ A) @ B ---------------------------------------------------------------


def program_lora(n: int, d: int, e: int, r: int, dtype: str = "f16") -> Program:
    p, x, (w,) = _x_and_weights("lora", n, d, e, dtype, "W")
    a = p.input("A", (d, r), dtype)
    bb = p.input("B", (r, e), dtype)
    p.output(p.op("add", x @ w, (x @ a) @ bb, name="O"))
    return p


def reference_lora(p: Program) -> SGraph:
    """Two kernels: D = X @ A in a library matmul, then one fused kernel for X @ W + D @ B whose
    loop splits both contraction dims at once (the loop size divides the rank)."""
    b = SGraphBuilder.for_program(p, "lora.fused")
    d = b.library("matmul", "X", "A", out="D")
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    main = k.op("matmul", k.input("X", [None], 1), k.input("W", [1], 0))
    low = k.op("matmul", k.input(d, [None], 1), k.input("B", [1], 0))
    k.output(k.acc(k.op("add", main, low)), "O", [1])
    return b.build(["O"])


# -- gqa: O = softmax(Q @ K) @ V, written with exp / sum / div -----------------------------------


def program_gqa(b: int, m: int, n: int, dh: int, dtype: str = "f16", qk_norm: bool = False) -> Program:
    p = Program("qknorm_gqa" if qk_norm else "gqa")
    q = p.input("Q", (b, m, dh), dtype)
    k = p.input("K", (b, dh, n), dtype)  # given transposed
    v = p.input("V", (b, n, dh), dtype)
    if qk_norm:
        # Normalized rows have norm sqrt(dh); the usual 1/sqrt(dh) keeps exp(Q K) in range.
        q = p.rms_norm(q, -1, EPS) * (1.0 / dh**0.5)
        k = p.rms_norm(k, 1, EPS)
    e = p.exp(q @ k)
    s = p.sum(e, -1, keepdim=True)
    p.output(p.op("matmul", e / s, v, name="O"))
    return p


def reference_gqa(p: Program, qk_norm: bool = False) -> SGraph:
    """Flash decoding in two kernels. The first splits batch, query rows and the KV length across
    the grid (x, y, z) and loops over KV tiles inside its chunk, accumulating exp(Q K) V and the
    row sums of exp(Q K); chunk z writes its partials to slice z of an extra span of the last dim.
    The second walks those chunks with its loop (the same axis z), sums them and divides."""
    name = "qknorm_gqa" if qk_norm else "gqa"
    b = SGraphBuilder.for_program(p, f"{name}.flashdecode")
    k1 = b.graph(grid=[("x", "gx"), ("y", "gy"), ("z", "gz")], loop=("f", "F"))
    qt = k1.input("Q", [0, 1, None], None)
    kt = k1.input("K", [0, None, 2], 2)
    vt = k1.input("V", [0, None, 1], 1)
    if qk_norm:
        dh = p.nodes["Q"].shape[-1]
        qt = k1.op("mul", k1.op("rms_norm", qt, dim=2, eps=EPS), k1.op("const", value=1.0 / dh**0.5))
        kt = k1.op("rms_norm", kt, dim=1, eps=EPS)
    e = k1.op("exp", k1.op("matmul", qt, kt))
    num = k1.acc(k1.op("matmul", e, vt))
    den = k1.acc(k1.op("sum", e, dim=2, keepdim=True))
    k1.output(num, "NUM", [0, 1, 2])
    k1.output(den, "DEN", [0, 1, 2])
    k2 = b.graph(grid=[("u", "hx"), ("v", "hy")], loop=("z", "gz"))
    a_num = k2.acc(k2.input("NUM", [0, 1], 2))
    a_den = k2.acc(k2.input("DEN", [0, 1], 2))
    k2.output(k2.after("div", a_num, a_den), "O", [0, 1])
    return b.build(["O"])


# -- ntrans: O = rms_norm(X + alpha * (rms_norm(H) + X)) ----------------------------------------


def program_ntrans(n: int, d: int, dtype: str = "f16") -> Program:
    p = Program("ntrans")
    h = p.input("H", (n, d), dtype)
    x = p.input("X", (n, d), dtype)
    alpha = p.input("alpha", (1, 1), dtype)
    inner = p.rms_norm(h, -1, EPS) + x
    p.output(p.op("rms_norm", x + alpha * inner, name="O", dim=-1, eps=EPS))
    return p


def reference_ntrans(p: Program) -> SGraph:
    """One kernel, no loop: the grid splits rows; each block holds whole rows and does both
    normalizations."""
    b = SGraphBuilder.for_program(p, "ntrans.fused")
    k = b.graph(grid=[("x", "gx")], loop=("f", 1))
    ht, xt = k.input("H", [0], None), k.input("X", [0], None)
    at = k.input("alpha", [None], None)
    inner = k.op("add", k.op("rms_norm", ht, dim=1, eps=EPS), xt)
    res = k.op("rms_norm", k.op("add", xt, k.op("mul", at, inner)), dim=1, eps=EPS)
    k.output(k.acc(res), "O", [0])
    return b.build(["O"])
