"""Two corpora of hand-made sGraphs for the issue "Proofs that hold for every size".

`WRONG` (corpus A): schedules that compute the wrong numbers at their program's real shapes but
would compute the right ones if two distinct dims (or a dim and a loop) had equal size. A prover
whose rules forget extents proves some of them: `sum(A + c, d) = sum(A, d) + sum(c, d)` turns the
constant into a term that names no size, so the constant summed over X's width and the one summed
over Y's width become one term. Every one of them must be refused, by the e-graph alone and by
`verify`.

`CORRECT` (corpus B): schedules that are right at every size (a few, marked, only at these
shapes) but spelled unusually: algebraic identities (rsqrt, silu, associativity), moved scales,
renamed or constant loops, reductions moved across the loop or across kernels. They measure how
much a sound prover still proves; the refused ones tell which rules are missing.

Each case is a named pair of builders: a program (real shapes, f32) and the sGraph for it. The
judges (`egraph_proof`, `numeric_errors`) are here too, so the tests and
`scripts/proof_corpus.py` judge alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from superopt import Program
from superopt.assignments import pick_for_checks
from superopt.build import BlockBuilder, SGraphBuilder
from superopt.instantiate import instantiate
from superopt.interpreter import run_float
from superopt.program import Tensor
from superopt.reference import inputs_and_reference, max_rel_err
from superopt.sgraph import SGraph
from superopt.targets import TARGETS
from superopt.verifier.egraph import ProofResult, prove
from superopt.verifier.lowering import lower_program, lower_sgraph
from superopt.workloads.llm import reference_lora

TARGET = TARGETS["h100"]
EPS = 1e-6
RIGHT_TOLERANCE = 1e-8  # float64 on both sides: only the summation order differs
WRONG_MARGIN = 1e-3  # a wrong schedule's outputs are off by far more than rounding


@dataclass(frozen=True)
class Case:
    """One program and one schedule for it. `every_size`: the schedule is right for every size
    that meets its constraints (False: right only because two untied dims happen to be equal
    here, so a prover whose proofs hold for every size may refuse it)."""

    name: str
    program: Callable[[], Program]
    sgraph: Callable[[Program], SGraph]
    every_size: bool = True

    def build(self) -> tuple[Program, SGraph]:
        p = self.program()
        return p, self.sgraph(p)


# -- judges -----------------------------------------------------------------------------------


def lower_both(program: Program, sg: SGraph) -> tuple[list[tuple[Any, Any]], list[str]]:
    """The (program, sGraph) term pairs and the axes."""
    rhs, axes = lower_sgraph(sg, program)
    return list(zip(lower_program(program), rhs, strict=True)), axes


def egraph_proof(program: Program, sg: SGraph) -> ProofResult:
    """The e-graph's verdict alone (no finite fields, no float check): what the issue is about."""
    pairs, axes = lower_both(program, sg)
    return prove(pairs, axes)


def numeric_errors(program: Program, sg: SGraph, instantiations: int = 2, seed: int = 0) -> list[float]:
    """The sGraph run in float64 at the program's real shapes, at `instantiations` assignments
    that `pick_for_checks` chooses, against the float64 reference: the worst relative error over
    the outputs, per assignment. Inputs keep every op defined (`inputs_and_reference`)."""
    inputs, want = inputs_and_reference(program, seed)
    errors = []
    for values in pick_for_checks(sg, TARGET, instantiations):
        got = run_float(instantiate(sg, values, TARGET), inputs, exact=True)
        errors.append(max(max_rel_err(g, w) for g, w in zip(got, want, strict=True)))
    return errors


def is_wrong(errors: list[float]) -> bool:
    return bool(errors) and all(e > WRONG_MARGIN or math.isnan(e) for e in errors)


def is_right(errors: list[float]) -> bool:
    return len(errors) >= 2 and all(e <= RIGHT_TOLERANCE for e in errors)


# -- small building blocks --------------------------------------------------------------------


def _const(k: BlockBuilder, value: float, post: bool = False) -> str:
    return k.after("const", value=value) if post else k.op("const", value=value)


def _row_sum(k: BlockBuilder, x: str, dim: int = 1) -> str:
    return k.op("sum", x, dim=dim, keepdim=True)


def _twice(k: BlockBuilder, y: str, c: str, folded: bool) -> str:
    """y + 2c, spelled y + (c + c) (folded) or (y + c) + c: the second form lets a rule that
    moves a tile map across `+ const` see a constant."""
    if folded:
        return k.op("add", y, k.op("add", c, c))
    return k.op("add", k.op("add", y, c), c)


def _biased_row_sums(name: str, wx: int, wy: int, bias: str, rows: int = 4) -> Program:
    """O = sum(X + c, -1) + sum(Y + c, -1): X and Y of different widths, c a constant 1, a (rows, 1)
    tensor B, or the row mean of X."""
    p = Program(name)
    x, y = p.input("X", (rows, wx), "f32"), p.input("Y", (rows, wy), "f32")
    c: Tensor | float = 1.0
    if bias == "tensor":
        c = p.input("B", (rows, 1), "f32")
    elif bias == "mean":
        c = p.mean(x, -1, keepdim=True)
    p.output(p.op("add", p.sum(x + c, -1, keepdim=True), p.sum(y + c, -1, keepdim=True), name="O"))
    return p


def _bias_tile(k: BlockBuilder, bias: str, xt: str) -> str:
    if bias == "one":
        return _const(k, 1.0)
    if bias == "tensor":
        return k.input("B", [0], None)
    return k.op("mean", xt, dim=1, keepdim=True)


# -- corpus A: wrong schedules ----------------------------------------------------------------


def _wrong_row_sums_sgraph(p: Program, bias: str, folded: bool, x_tensor: str = "X") -> SGraph:
    """One kernel, the grid over rows: O = sum(X) + sum(Y + 2c). Right only if X and Y had one
    width: the bias X's width carried moves onto Y's."""
    b = SGraphBuilder.for_program(p)
    if x_tensor != "X":
        b.library("transpose", "X", out=x_tensor, perm=[1, 0])
    k = b.graph(grid=[("x", "gx")])
    xt, yt = k.input(x_tensor, [0], None), k.input("Y", [0], None)
    c = _bias_tile(k, bias, xt)
    o = k.op("add", _row_sum(k, xt), _row_sum(k, _twice(k, yt, c, folded)))
    k.output(k.acc(o), "O", [0])
    return b.build(["O"])


def base_case(wx: int, wy: int) -> Case:
    """The base case at other widths of X and Y (right where they are equal)."""
    return Case(f"1 base, widths {wx} and {wy}", lambda: _biased_row_sums(f"base_{wx}_{wy}", wx, wy, "one"),
                lambda p: _wrong_row_sums_sgraph(p, "one", True))


def _transposed_widths_program() -> Program:
    """The base case with X's width taken from a transposed view: O = sum(X^T + 1) + sum(Y + 1)."""
    p = Program("transposed_widths")
    xt = p.transpose(p.input("X", (64, 4), "f32"), (1, 0))
    y = p.input("Y", (4, 32), "f32")
    p.output(p.op("add", p.sum(xt + 1.0, -1, keepdim=True), p.sum(y + 1.0, -1, keepdim=True), name="O"))
    return p


def _transposed_widths_stored_sgraph(p: Program) -> SGraph:
    """X reduced along its stored rows by a kernel over its columns, then viewed transposed and
    added to sum(Y + 2) by a second kernel: the constant X's 64 rows carried is now Y's."""
    b = SGraphBuilder.for_program(p)
    k1 = b.graph(grid=[("x", "gx")])
    k1.output(k1.acc(_row_sum(k1, k1.input("X", [1], None), dim=0)), "SX", [1])
    b.library("transpose", "SX", out="SXT", perm=[1, 0])
    k2 = b.graph(grid=[("y", "gy")])
    yt = k2.input("Y", [0], None)
    o = k2.op("add", k2.input("SXT", [0], None), _row_sum(k2, _twice(k2, yt, _const(k2, 1.0), folded=False)))
    k2.output(k2.acc(o), "O", [0])
    return b.build(["O"])


def _own_dims_program() -> Program:
    """Two dims of one tensor's history: X's width (64) and the width of X @ W (32)."""
    p = Program("own_dims")
    x, w = p.input("X", (4, 64), "f32"), p.input("W", (64, 32), "f32")
    p.output(p.op("add", p.sum(x + 1.0, -1, keepdim=True), p.sum(x @ w + 1.0, -1, keepdim=True), name="O"))
    return p


def _own_dims_sgraph(p: Program) -> SGraph:
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")])
    xt, wt = k.input("X", [0], None), k.input("W", [None], None)
    mm = k.op("matmul", xt, wt)
    o = k.op("add", _row_sum(k, xt), _row_sum(k, _twice(k, mm, _const(k, 1.0), folded=False)))
    k.output(k.acc(o), "O", [0])
    return b.build(["O"])


def _leading_broadcast_program() -> Program:
    """A (64,) vector V added to X (4, 64) and Y (8, 64), summed over the rows it is broadcast
    along: 4 V and 8 V."""
    p = Program("leading_broadcast")
    x, y, v = p.input("X", (4, 64), "f32"), p.input("Y", (8, 64), "f32"), p.input("V", (64,), "f32")
    p.output(p.op("add", p.sum(x + v, 0, keepdim=True), p.sum(y + v, 0, keepdim=True), name="O"))
    return p


def _leading_broadcast_sgraph(p: Program) -> SGraph:
    """The grid over columns: sum(X, 0) + sum((Y + V) + V, 0), i.e. 16 V where 12 V belongs."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")])
    xt, yt, vt = k.input("X", [1], None), k.input("Y", [1], None), k.input("V", [0], None)
    o = k.op("add", _row_sum(k, xt, dim=0), _row_sum(k, _twice(k, yt, vt, folded=False), dim=0))
    k.output(k.acc(o), "O", [1])
    return b.build(["O"])


def _nested_broadcast_program() -> Program:
    """A (1, 1) tensor S broadcast along both dims of X (4, 64) and Y (2, 32), summed over both:
    256 S and 64 S."""
    p = Program("nested_broadcast")
    x, y, s = p.input("X", (4, 64), "f32"), p.input("Y", (2, 32), "f32"), p.input("S", (1, 1), "f32")
    total = lambda t: p.sum(p.sum(t + s, -1, keepdim=True), -2, keepdim=True)
    p.output(p.op("add", total(x), total(y), name="O"))
    return p


def _nested_broadcast_sgraph(p: Program) -> SGraph:
    """One block walking the rows of X and Y: sum(sum(X)) + sum(sum((Y + S) + S)), 128 S."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", 1)], loop=("f", "F"))
    xt, yt, st = k.input("X", [None], 0), k.input("Y", [None], 0), k.input("S", [None], None)
    total = lambda t: _row_sum(k, _row_sum(k, t), dim=0)
    k.output(k.acc(k.op("add", total(xt), total(_twice(k, yt, st, folded=False)))), "O", [0])
    return b.build(["O"])


def _commuted_3d_program() -> Program:
    """Sums over the last two dims of X (2, 8, 64) and Y (2, 4, 32), each of (T + 1)."""
    p = Program("commuted_3d")
    x, y = p.input("X", (2, 8, 64), "f32"), p.input("Y", (2, 4, 32), "f32")
    total = lambda t: p.sum(p.sum(t + 1.0, -1, keepdim=True), -2, keepdim=True)
    p.output(p.op("add", total(x), total(y), name="O"))
    return p


def _commuted_3d_sgraph(p: Program) -> SGraph:
    """The grid over the batch; both sums taken in the other order, X's 512 ones moved onto Y's
    128 elements as a second one each."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")])
    xt, yt = k.input("X", [0], None), k.input("Y", [0], None)
    total = lambda t: _row_sum(k, _row_sum(k, t, dim=1), dim=2)
    o = k.op("add", total(xt), total(_twice(k, yt, _const(k, 1.0), folded=False)))
    k.output(k.acc(o), "O", [0])
    return b.build(["O"])


def _looped_row_sums_sgraph(p: Program) -> SGraph:
    """The grid over rows, a loop over the columns of X and Y at once: each iteration adds
    sum(X tile) + sum(Y tile + 2), so the constants reassemble to 2 x 32, not 64 + 32."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    xt, yt = k.input("X", [0], 1), k.input("Y", [0], 1)
    o = k.op("add", _row_sum(k, xt), _row_sum(k, _twice(k, yt, _const(k, 1.0), folded=False)))
    k.output(k.acc(o), "O", [0])
    return b.build(["O"])


def _split_k_row_sums_sgraph(p: Program) -> SGraph:
    """Kernel 1 splits the columns of X and Y into gz chunks; each chunk's partial result is
    sum(X chunk) + sum(Y chunk + 2); kernel 2 sums the chunks over its loop (the same axis z)."""
    b = SGraphBuilder.for_program(p)
    k1 = b.graph(grid=[("x", "gx"), ("z", "gz")])
    xt, yt = k1.input("X", [0, 1], None), k1.input("Y", [0, 1], None)
    part = k1.op("add", _row_sum(k1, xt), _row_sum(k1, _twice(k1, yt, _const(k1, 1.0), folded=False)))
    k1.output(k1.acc(part), "P", [0, 1])
    k2 = b.graph(grid=[("u", "hu")], loop=("z", "gz"))
    k2.output(k2.acc(k2.input("P", [0], 1)), "O", [0])
    return b.build(["O"])


# -- reductions moved onto a product's operand (corpora A and B) -------------------------------


def _reduced_biased_product(op: str, dim: int = -1) -> Callable[[], Program]:
    """The row sums (means) of X @ W + B, B a row broadcast along X's rows (`dim` -2: the column
    sums, over the rows B is broadcast along)."""
    return lambda: _program(f"{op}_biased_product", {"X": (8, 16), "W": (16, 12), "B": (1, 12)},
                            lambda p, x, w, bias: p.op(op, p.op("add", x @ w, bias), dim=dim, keepdim=True))


def _reduced_on_the_weights(op: str, bias_op: str | None = None) -> Callable[[Program], SGraph]:
    """X @ W + B reduced along W's columns as X @ reduce(W) + reduce(B): the weight's rows
    reduced in one kernel, then a matrix-vector product with B reduced (by `bias_op`, default
    `op`) once per block."""
    def make(p: Program) -> SGraph:
        b = SGraphBuilder.for_program(p)
        k0 = b.graph(grid=[("x", "gx")])
        k0.output(k0.acc(k0.op(op, k0.input("W", [0], None), dim=1, keepdim=True)), "R", [0])
        k1 = b.graph(grid=[("y", "gy")])
        product = k1.op("matmul", k1.input("X", [0], None), k1.input("R", [None], None))
        bias = k1.op(bias_op or op, k1.input("B", [None], None), dim=1, keepdim=True)
        k1.output(k1.acc(k1.op("add", product, bias)), "O", [0])
        return b.build(["O"])
    return make


def _column_sums_without_row_count(p: Program) -> SGraph:
    """Column sums of X @ W + B as colsum(X) @ W + B: B added once, not once per row."""
    b = SGraphBuilder.for_program(p)
    k0 = b.graph(grid=[("x", "gx")])
    k0.output(k0.acc(k0.op("sum", k0.input("X", [1], None), dim=0, keepdim=True)), "CX", [1])
    k1 = b.graph(grid=[("y", "gy")])
    product = k1.op("matmul", k1.input("CX", [None], None), k1.input("W", [1], None))
    k1.output(k1.acc(k1.op("add", product, k1.input("B", [1], None))), "O", [1])
    return b.build(["O"])


def _reduced_column_scaled_product(op: str) -> Program:
    """The row sums of (X @ W) scaled column by column (S of shape (1, N)), by `op` (mul or div)."""
    return _program(f"rowsum_{op}_scaled_product", {"X": (8, 16), "W": (16, 12), "S": (1, 12)},
                    lambda p, x, w, scale: p.op("sum", p.op(op, x @ w, scale), dim=-1, keepdim=True))


def _scaled_weight_row_sums(op: str, apart: bool = False) -> Callable[[Program], SGraph]:
    """The scale moved into W and W's scaled rows summed in one kernel, then X @ that vector
    (`apart`: W's rows and S summed each alone, their product taken: wrong)."""
    def make(p: Program) -> SGraph:
        b = SGraphBuilder.for_program(p)
        k = b.graph(grid=[("x", "gx")])
        w, scale = k.input("W", [0], None), k.input("S", [None], None)
        row = k.op(op, k.op("sum", w, dim=1, keepdim=True), k.op("sum", scale, dim=1, keepdim=True)) if apart \
            else k.op("sum", k.op(op, w, scale), dim=1, keepdim=True)
        k.output(k.acc(row), "R", [0])
        b.library("matmul", "X", "R", out="O")
        return b.build(["O"])
    return make


def row_reduction(op: str = "max") -> Program:
    """O = op(X, -1) of one (4, 64) input: the smallest program a loop over columns can get wrong."""
    p = Program(f"row_{op}")
    p.output(p.op(op, p.input("X", (4, 64), "f32"), name="O", dim=-1, keepdim=True))
    return p


def _summed_tile_maxima_sgraph(p: Program) -> SGraph:
    """The loop over columns sums each tile's maximum: the row maximum only with one tile."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    k.output(k.acc(k.op("max", k.input("X", [0], 1), dim=1, keepdim=True)), "O", [0])
    return b.build(["O"])


WRONG: dict[str, Case] = {c.name: c for c in [
    # 1. the base case: the constant 1 summed over widths 64 and 32, and its variants
    Case("1 base: sum(X+1) + sum(Y+1) as sum(X) + sum(Y+(1+1))",
         lambda: _biased_row_sums("base", 64, 32, "one"), lambda p: _wrong_row_sums_sgraph(p, "one", True)),
    Case("1 base, repeated: sum(X) + sum((Y+1)+1)", lambda: _biased_row_sums("base", 64, 32, "one"),
         lambda p: _wrong_row_sums_sgraph(p, "one", False)),
    Case("1 base, widths 4096 and 1024", lambda: _biased_row_sums("base_wide", 4096, 1024, "one"),
         lambda p: _wrong_row_sums_sgraph(p, "one", True)),
    Case("1 tensor bias B (4,1), folded: sum(X) + sum(Y+(B+B))",
         lambda: _biased_row_sums("bias", 64, 32, "tensor"), lambda p: _wrong_row_sums_sgraph(p, "tensor", True)),
    Case("1 tensor bias B (4,1), repeated: sum(X) + sum((Y+B)+B)",
         lambda: _biased_row_sums("bias", 64, 32, "tensor"), lambda p: _wrong_row_sums_sgraph(p, "tensor", False)),
    # 2. a width read through a transposed view
    Case("2 width from a transposed view", _transposed_widths_program,
         lambda p: _wrong_row_sums_sgraph(p, "one", False, x_tensor="XT")),
    Case("2 width from a transposed view, reduced as stored", _transposed_widths_program,
         _transposed_widths_stored_sgraph),
    # 3. two dims of one tensor's history
    Case("3 width of X @ W against the width of X", _own_dims_program, _own_dims_sgraph),
    # 4. a computed row statistic as the bias
    Case("4 row mean as bias, repeated: sum(X) + sum((Y+m)+m)",
         lambda: _biased_row_sums("mean_bias", 64, 32, "mean"), lambda p: _wrong_row_sums_sgraph(p, "mean", False)),
    Case("4 row mean as bias, folded: sum(X) + sum(Y+(m+m))",
         lambda: _biased_row_sums("mean_bias", 64, 32, "mean"), lambda p: _wrong_row_sums_sgraph(p, "mean", True)),
    # 5. broadcasts the program leaves implicit
    Case("5 implicit leading broadcast of a (64,) vector", _leading_broadcast_program, _leading_broadcast_sgraph),
    Case("5 nested broadcast of a (1,1) tensor", _nested_broadcast_program, _nested_broadcast_sgraph),
    # 6. 3-D reductions in the other order
    Case("6 3-D sums commuted over different dims", _commuted_3d_program, _commuted_3d_sgraph),
    # 7. across a loop
    Case("7 per-tile constants reassembled over a loop", lambda: _biased_row_sums("looped", 64, 32, "one"),
         _looped_row_sums_sgraph),
    # 8. across two kernels
    Case("8 split-K partials each carrying a constant", lambda: _biased_row_sums("split", 64, 32, "one"),
         _split_k_row_sums_sgraph),
    # 9. a sum where a max belongs
    Case("9 sum of per-tile maxima for the row max", row_reduction, _summed_tile_maxima_sgraph),
    # 10. a reduction moved onto a product's weight, its bias or scale reduced wrongly
    Case("10 row sums of X @ W + B with B's mean for its sum", _reduced_biased_product("sum"),
         _reduced_on_the_weights("sum", "mean")),
    Case("10 column sums of X @ W + B with B added once", _reduced_biased_product("sum", -2),
         _column_sums_without_row_count),
    Case("10 row sums of (X @ W) * S with W and S summed apart", partial(_reduced_column_scaled_product, "mul"),
         _scaled_weight_row_sums("mul", apart=True)),
]}


# -- corpus B: correct but unusual schedules --------------------------------------------------


def _rows_kernel(p: Program, body: Callable[[BlockBuilder, dict[str, str]], str],
                 tensors: dict[str, list[int | None]]) -> SGraph:
    """One kernel whose grid splits the rows, no loop (the shape of most elementwise and
    row-reduction cases): `tensors` gives each input's imap, `body` the output tile from them."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")])
    tiles = {name: k.input(name, imap, None) for name, imap in tensors.items()}
    k.output(k.acc(body(k, tiles)), "O", [0])
    return b.build(["O"])


def _program(name: str, inputs: dict[str, tuple[int, ...]], make: Callable[..., Tensor]) -> Program:
    """A program over named f32 inputs whose one output `make(p, *inputs)` computes."""
    p = Program(name)
    ts = [p.input(n, s, "f32") for n, s in inputs.items()]
    p.output(make(p, *ts))
    return p


def _matmul_cols_sgraph(p: Program, post: Callable[[BlockBuilder, str], str]) -> SGraph:
    """X @ W with the grid over W's columns and the loop over K; `post` after the loop."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    acc = k.acc(k.op("matmul", k.input("X", [None], 1), k.input("W", [1], 0)))
    k.output(post(k, acc), "O", [1])
    return b.build(["O"])


# 1. rsqrt for 1 / sqrt


def _x_over_sqrt_v() -> Program:
    return _program("x_over_sqrt", {"X": (8, 64), "V": (8, 64)}, lambda p, x, v: x / p.sqrt(v))


def _x_times_rsqrt_v(p: Program) -> SGraph:
    return _rows_kernel(p, lambda k, t: k.op("mul", t["X"], k.op("rsqrt", t["V"])), {"X": [0], "V": [0]})


def _rms_norm() -> Program:
    return _program("rms_norm", {"X": (8, 64)}, lambda p, x: p.rms_norm(x, -1, EPS))


def _rms_norm_rsqrt(p: Program) -> SGraph:
    """x * rsqrt(mean(x * x) + eps) in one block per row group."""
    def body(k: BlockBuilder, t: dict[str, str]) -> str:
        x = t["X"]
        ms = k.op("mean", k.op("mul", x, x), dim=1, keepdim=True)
        return k.op("mul", x, k.op("rsqrt", k.op("add", ms, _const(k, EPS))))
    return _rows_kernel(p, body, {"X": [0]})


def _rms_norm_looped(p: Program) -> SGraph:
    """rms_norm over a loop: the row's tiles concatenated, the mean of squares averaged over
    the tiles, the division after the loop."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    xt = k.input("X", [0], 1)
    whole = k.acc(xt, "concat", dim=1)
    ms = k.acc(k.op("mean", k.op("square", xt), dim=1, keepdim=True), "mean")
    k.output(k.after("div", whole, k.after("sqrt", k.after("add", ms, _const(k, EPS, post=True)))), "O", [0])
    return b.build(["O"])


def _rms_norm_two_kernels(p: Program) -> SGraph:
    """Kernel 1 writes each row's mean square (a loop over the columns); kernel 2, over rows and
    columns, divides."""
    b = SGraphBuilder.for_program(p)
    k1 = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    k1.output(k1.acc(k1.op("mean", k1.op("square", k1.input("X", [0], 1)), dim=1, keepdim=True), "mean"), "MS", [0])
    k2 = b.graph(grid=[("u", "hu"), ("v", "hv")], loop=("g", 1))
    xt, ms = k2.input("X", [0, 1], None), k2.input("MS", [0, None], None)
    rms = k2.op("sqrt", k2.op("add", ms, _const(k2, EPS)))
    k2.output(k2.acc(k2.op("div", xt, rms)), "O", [0, 1])
    return b.build(["O"])


# 2. silu spelled out


def _silu_matmul() -> Program:
    return _program("silu_matmul", {"X": (4, 64), "W": (64, 32)}, lambda p, x, w: p.silu(x @ w))


def _silu_as_product(p: Program) -> SGraph:
    return _matmul_cols_sgraph(p, lambda k, a: k.after("mul", a, k.after("sigmoid", a)))


def _silu_as_quotient(p: Program) -> SGraph:
    def post(k: BlockBuilder, a: str) -> str:
        return k.after("div", a, k.after("add", _const(k, 1.0, post=True), k.after("exp", k.after("neg", a))))
    return _matmul_cols_sgraph(p, post)


# 3-4. matmul associativity and distributivity


def _chain() -> Program:
    return _program("chain", {"X": (4, 32), "A": (32, 16), "B": (16, 24)}, lambda p, x, a, bb: x @ (a @ bb))


def _chain_left_first(p: Program) -> SGraph:
    """(X @ A) @ B: a library matmul, then a kernel over B's columns."""
    b = SGraphBuilder.for_program(p)
    t = b.library("matmul", "X", "A", out="T")
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    k.output(k.acc(k.op("matmul", k.input(t, [None], 1), k.input("B", [1], 0))), "O", [1])
    return b.build(["O"])


def _lora_program(factored: bool) -> Program:
    """X @ (W + A @ B) (factored) or X @ W + (X @ A) @ B."""
    def make(p: Program, x: Tensor, w: Tensor, a: Tensor, bb: Tensor) -> Tensor:
        return x @ (w + a @ bb) if factored else x @ w + (x @ a) @ bb
    return _program("lora", {"X": (4, 64), "W": (64, 32), "A": (64, 16), "B": (16, 32)}, make)


def _lora_graph_down_sgraph(p: Program) -> SGraph:
    """D = X @ A in a graph kernel over rows; then X @ W + D @ B, the low-rank product summed over
    a loop of its own rank's chunks and X @ W taken whole."""
    b = SGraphBuilder.for_program(p)
    k1 = b.graph(grid=[("r", "gr")], loop=("f", "F"))
    k1.output(k1.acc(k1.op("matmul", k1.input("X", [0], 1), k1.input("A", [None], 0))), "D", [0])
    k2 = b.graph(grid=[("x", "gx")], loop=("l", "L"))
    main = k2.acc(k2.op("matmul", k2.input("X", [None], None), k2.input("W", [1], None)), "mean")
    low = k2.acc(k2.op("matmul", k2.input("D", [None], 1), k2.input("B", [1], 0)))
    k2.output(k2.after("add", main, low), "O", [1])
    return b.build(["O"])


# 5. constant scales across a matmul


def _scaled_matmul(where: str) -> Program:
    def make(p: Program, x: Tensor, w: Tensor) -> Tensor:
        return (x * 0.5) @ w if where == "left" else (x @ w) * 0.5
    return _program(f"scaled_{where}", {"X": (4, 64), "W": (64, 32)}, make)


def _scale_on_weight_tiles(p: Program) -> SGraph:
    """The scale applied to each tile of W inside the loop."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    wt = k.op("mul", k.input("W", [1], 0), _const(k, 0.5))
    k.output(k.acc(k.op("matmul", k.input("X", [None], 1), wt)), "O", [1])
    return b.build(["O"])


def _scale_after_loop(p: Program) -> SGraph:
    return _matmul_cols_sgraph(p, lambda k, a: k.after("mul", a, _const(k, 0.5, post=True)))


def _row_scaled_matmul() -> Program:
    return _program("row_divided_mm", {"X": (4, 64), "S": (4, 1), "W": (64, 32)}, lambda p, x, s, w: (x / s) @ w)


def _row_division_after(p: Program) -> SGraph:
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    acc = k.acc(k.op("matmul", k.input("X", [None], 1), k.input("W", [1], 0)))
    s = k.acc(k.input("S", [None], None), "mean")
    k.output(k.after("div", acc, s), "O", [1])
    return b.build(["O"])


# 6. loops: constant size, renamed, sums after the loop


def _row_mean() -> Program:
    return _program("row_mean", {"X": (8, 64)}, lambda p, x: p.mean(x, -1, keepdim=True))


def _mean_of_two_halves(p: Program) -> SGraph:
    """A loop of constant size 2 over the columns, each half's mean averaged."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", 2))
    k.output(k.acc(k.op("mean", k.input("X", [0], 1), dim=1, keepdim=True), "mean"), "O", [0])
    return b.build(["O"])


def _split_k() -> Program:
    return _program("split_k", {"X": (4, 64), "A": (64, 16)}, lambda p, x, a: x @ a)


def _split_k_merge(p: Program, loop_axis: str) -> SGraph:
    """Kernel 1 writes one partial product per chunk of K (grid axis z) side by side; kernel 2
    sums them with a loop of gz steps, named z (the same index space) or otherwise."""
    b = SGraphBuilder.for_program(p)
    k1 = b.graph(grid=[("z", "gz")])
    k1.output(k1.acc(k1.op("matmul", k1.input("X", [1], None), k1.input("A", [0], None))), "P", [1])
    k2 = b.graph(grid=[("u", "hu")], loop=(loop_axis, "gz"))
    k2.output(k2.acc(k2.input("P", [0], 1)), "O", [0])
    return b.build(["O"])


def _row_sum_exp() -> Program:
    return _program("row_sum_exp", {"X": (8, 64)}, lambda p, x: p.sum(p.exp(x), -1, keepdim=True))


def _sum_after_loop(p: Program) -> SGraph:
    """exp of each tile concatenated over the loop, the row sum taken once after it."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    whole = k.acc(k.op("exp", k.input("X", [0], 1)), "concat", dim=1)
    k.output(k.after("sum", whole, dim=1, keepdim=True), "O", [0])
    return b.build(["O"])


def _row_max_after_loop(p: Program) -> SGraph:
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    whole = k.acc(k.input("X", [0], 1), "concat", dim=1)
    k.output(k.after("max", whole, dim=1, keepdim=True), "O", [0])
    return b.build(["O"])


def _row_sums_in_chunks(p: Program, kind: str, of_exp: bool) -> SGraph:
    """Kernel 1 reduces each chunk of a row (of X or of exp(X); grid axis z over the columns);
    kernel 2 combines the chunks over its loop (the same axis z): sums of sums, or means of means."""
    b = SGraphBuilder.for_program(p)
    k1 = b.graph(grid=[("x", "gx"), ("z", "gz")])
    xt = k1.input("X", [0, 1], None)
    k1.output(k1.acc(k1.op(kind, k1.op("exp", xt) if of_exp else xt, dim=1, keepdim=True)), "P", [0, 1])
    k2 = b.graph(grid=[("u", "hu")], loop=("z", "gz"))
    k2.output(k2.acc(k2.input("P", [0], 1), kind), "O", [0])
    return b.build(["O"])


# 7. grids and layouts


def _matmul_program(m: int = 8) -> Program:
    return _program("matmul", {"X": (m, 64), "W": (64, 32)}, lambda p, x, w: x @ w)


def _matmul_over_rows(p: Program) -> SGraph:
    """The grid over X's rows (W whole in every block), the loop over K."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    k.output(k.acc(k.op("matmul", k.input("X", [0], 1), k.input("W", [None], 0))), "O", [0])
    return b.build(["O"])


def _matmul_negated_twice(p: Program) -> SGraph:
    """(-X) @ (-W): the signs cancel."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    xt, wt = k.op("neg", k.input("X", [None], 1)), k.op("neg", k.input("W", [1], 0))
    k.output(k.acc(k.op("matmul", xt, wt)), "O", [1])
    return b.build(["O"])


def _transposed_product() -> Program:
    return _program("transposed_product", {"X": (4, 64), "W": (64, 32)}, lambda p, x, w: p.transpose(x @ w, (1, 0)))


def _transposed_output(p: Program) -> SGraph:
    """X @ W in a kernel, its output viewed transposed."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    k.output(k.acc(k.op("matmul", k.input("X", [None], 1), k.input("W", [1], 0))), "OT", [1])
    b.library("transpose", "OT", out="O", perm=[1, 0])
    return b.build(["O"])


def _transposed_operands(p: Program) -> SGraph:
    """W^T @ X^T read through views: (X W)^T written directly."""
    b = SGraphBuilder.for_program(p)
    b.library("transpose", "W", out="WT", perm=[1, 0])
    b.library("transpose", "X", out="XT", perm=[1, 0])
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    k.output(k.acc(k.op("matmul", k.input("WT", [0], 1), k.input("XT", [None], 0))), "O", [0])
    return b.build(["O"])


def _batched_matmul() -> Program:
    return _program("batched", {"Q": (2, 8, 16), "K": (2, 16, 32)}, lambda p, q, k: q @ k)


def _batched_over_batch_and_rows(p: Program) -> SGraph:
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx"), ("y", "gy")], loop=("f", "F"))
    mm = k.op("matmul", k.input("Q", [0, 1], 2), k.input("K", [0, None], 1))
    k.output(k.acc(mm), "O", [0, 1])
    return b.build(["O"])


def _column_mean() -> Program:
    return _program("column_mean", {"X": (16, 32)}, lambda p, x: p.mean(x, 0, keepdim=True))


def _column_mean_over_rows_loop(p: Program) -> SGraph:
    """The grid over columns, the loop over rows: tile means averaged."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    k.output(k.acc(k.op("mean", k.input("X", [1], 0), dim=0, keepdim=True), "mean"), "O", [1])
    return b.build(["O"])


def _sum_of_transposed() -> Program:
    return _program("sum_of_transposed", {"X": (32, 8)},
                    lambda p, x: p.sum(p.exp(p.transpose(x, (1, 0))), -1, keepdim=True))


def _sum_over_stored_rows(p: Program) -> SGraph:
    """X^T's row sums are X's column sums: reduced as stored, viewed transposed."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")])
    k.output(k.acc(k.op("sum", k.op("exp", k.input("X", [1], None)), dim=0, keepdim=True)), "S", [1])
    b.library("transpose", "S", out="O", perm=[1, 0])
    return b.build(["O"])


# 8. reductions and their constants


def _mean_plus_one() -> Program:
    return _program("mean_plus_one", {"X": (8, 64)}, lambda p, x: p.mean(x + 1.0, -1, keepdim=True))


def _mean_then_one(p: Program) -> SGraph:
    return _rows_kernel(p, lambda k, t: k.op("add", k.op("mean", t["X"], dim=1, keepdim=True), _const(k, 1.0)),
                        {"X": [0]})


def _scaled_sum() -> Program:
    return _program("scaled_sum", {"X": (8, 64)}, lambda p, x: p.sum(x * 3.0, -1, keepdim=True))


def _scale_after_sum(p: Program) -> SGraph:
    return _rows_kernel(p, lambda k, t: k.op("mul", _row_sum(k, t["X"]), _const(k, 3.0)), {"X": [0]})


def _row_scaled_sum() -> Program:
    return _program("row_scaled_sum", {"X": (8, 64), "S": (8, 1)}, lambda p, x, s: p.sum(x, -1, keepdim=True) * s)


def _scale_before_sum(p: Program) -> SGraph:
    return _rows_kernel(p, lambda k, t: _row_sum(k, k.op("mul", t["X"], t["S"])), {"X": [0], "S": [0]})


def _mean_of_means() -> Program:
    return _program("mean_of_means", {"X": (8, 32)},
                    lambda p, x: p.mean(p.mean(x, 0, keepdim=True), 1, keepdim=True))


def _means_other_order(p: Program) -> SGraph:
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", 1)], loop=("f", "F"))
    rows = k.acc(k.op("mean", k.input("X", [None], 0), dim=1, keepdim=True), "concat", dim=0)
    k.output(k.after("mean", rows, dim=0, keepdim=True), "O", [0])
    return b.build(["O"])


def _centered() -> Program:
    return _program("centered", {"X": (8, 64)}, lambda p, x: x - p.mean(x, -1, keepdim=True))


def _centered_over_loop(p: Program) -> SGraph:
    """The row's tiles concatenated and its tile means averaged over the loop; subtracted after."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    xt = k.input("X", [0], 1)
    whole, mean = k.acc(xt, "concat", dim=1), k.acc(k.op("mean", xt, dim=1, keepdim=True), "mean")
    k.output(k.after("sub", whole, mean), "O", [0])
    return b.build(["O"])


# 9. softmax and attention


def _softmax() -> Program:
    return _program("softmax", {"X": (8, 64)}, lambda p, x: p.softmax(x, -1))


def _softmax_without_max(p: Program) -> SGraph:
    def body(k: BlockBuilder, t: dict[str, str]) -> str:
        e = k.op("exp", t["X"])
        return k.op("div", e, _row_sum(k, e))
    return _rows_kernel(p, body, {"X": [0]})


def _attention() -> Program:
    def make(p: Program, q: Tensor, kk: Tensor, v: Tensor) -> Tensor:
        e = p.exp(q @ kk)
        return (e / p.sum(e, -1, keepdim=True)) @ v
    return _program("attention", {"Q": (2, 8, 16), "K": (2, 16, 64), "V": (2, 64, 16)}, make)


def _attention_one_kernel(p: Program) -> SGraph:
    """One kernel over batch and query rows, the loop over the keys: exp(Q K) V and the row sums
    of exp(Q K) accumulated, divided after."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx"), ("y", "gy")], loop=("f", "F"))
    e = k.op("exp", k.op("matmul", k.input("Q", [0, 1], None), k.input("K", [0, None], 2)))
    num = k.acc(k.op("matmul", e, k.input("V", [0, None], 1)))
    den = k.acc(k.op("sum", e, dim=2, keepdim=True))
    k.output(k.after("div", num, den), "O", [0, 1])
    return b.build(["O"])


# 10. elementwise algebra


def _exp_of_sum() -> Program:
    return _program("exp_of_sum", {"X": (8, 64), "Y": (8, 64)}, lambda p, x, y: p.exp(x + y))


def _product_of_exps(p: Program) -> SGraph:
    return _rows_kernel(p, lambda k, t: k.op("mul", k.op("exp", t["X"]), k.op("exp", t["Y"])), {"X": [0], "Y": [0]})


def _difference() -> Program:
    return _program("difference", {"X": (8, 64), "Y": (8, 64)}, lambda p, x, y: x - y)


def _plus_negated(p: Program) -> SGraph:
    return _rows_kernel(p, lambda k, t: k.op("add", t["X"], k.op("neg", t["Y"])), {"X": [0], "Y": [0]})


def _three_sum() -> Program:
    return _program("three_sum", {"X": (8, 64), "Y": (8, 64), "Z": (8, 64)}, lambda p, x, y, z: (x + y) + z)


def _regrouped_three_sum(p: Program) -> SGraph:
    return _rows_kernel(p, lambda k, t: k.op("add", t["X"], k.op("add", t["Z"], t["Y"])),
                        {"X": [0], "Y": [0], "Z": [0]})


def _sum_matmul() -> Program:
    return _program("sum_matmul", {"X": (4, 64), "Y": (4, 64), "W": (64, 32)}, lambda p, x, y, w: (x + y) @ w)


def _distributed_matmul(p: Program) -> SGraph:
    """(X + Y) @ W as X @ W + Y @ W over the loop."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    wt = k.input("W", [1], 0)
    both = k.op("add", k.op("matmul", k.input("X", [None], 1), wt), k.op("matmul", k.input("Y", [None], 1), wt))
    k.output(k.acc(both), "O", [1])
    return b.build(["O"])


def _summed_operands_in_loop(p: Program) -> SGraph:
    """(X + Y) tiles added inside the loop before the product."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    xy = k.op("add", k.input("X", [None], 1), k.input("Y", [None], 1))
    k.output(k.acc(k.op("matmul", xy, k.input("W", [1], 0))), "O", [1])
    return b.build(["O"])


def _relu_matmul() -> Program:
    return _program("relu_matmul", {"X": (8, 64), "W": (64, 32)}, lambda p, x, w: p.relu(x) @ w)


def _relu_in_loop(p: Program) -> SGraph:
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    k.output(k.acc(k.op("matmul", k.op("relu", k.input("X", [0], 1)), k.input("W", [None], 0))), "O", [0])
    return b.build(["O"])


# 11. gated MLPs


def _gated_mlp() -> Program:
    return _program("gated_mlp", {"X": (4, 64), "W1": (64, 32), "W2": (64, 32)},
                    lambda p, x, w1, w2: p.silu(x @ w1) * (x @ w2))


def _gated_mlp_sgraph(p: Program, post: Callable[[BlockBuilder, str, str], str]) -> SGraph:
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    xt = k.input("X", [None], 1)
    a1 = k.acc(k.op("matmul", xt, k.input("W1", [1], 0)))
    a2 = k.acc(k.op("matmul", xt, k.input("W2", [1], 0)))
    k.output(post(k, a1, a2), "O", [1])
    return b.build(["O"])


def _gated_mlp_two_stages(p: Program) -> SGraph:
    """Both projections by library matmuls, then one elementwise kernel over rows and columns."""
    b = SGraphBuilder.for_program(p)
    h1, h2 = b.library("matmul", "X", "W1", out="H1"), b.library("matmul", "X", "W2", out="H2")
    k = b.graph(grid=[("u", "hu"), ("v", "hv")])
    k.output(k.acc(k.op("mul", k.op("silu", k.input(h1, [0, 1], None)), k.input(h2, [0, 1], None))), "O", [0, 1])
    return b.build(["O"])


def _untied_equal_widths() -> Program:
    return _biased_row_sums("untied_equal", 32, 32, "one")


def _one_loop_over_both_widths(p: Program) -> SGraph:
    """X and Y of equal widths (32, not tied by the program) walked by one loop: each iteration
    adds sum(X tile + 1) + sum(Y tile + 1). Right for any sizes the loop divides."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    xt, yt, one = k.input("X", [0], 1), k.input("Y", [0], 1), _const(k, 1.0)
    o = k.op("add", _row_sum(k, k.op("add", xt, one)), _row_sum(k, k.op("add", yt, one)))
    k.output(k.acc(o), "O", [0])
    return b.build(["O"])


def _row_sum_plus_one() -> Program:
    return _program("row_sum_plus_one", {"X": (4, 64)}, lambda p, x: p.sum(x + 1.0, -1, keepdim=True))


def _one_added_per_tile(p: Program) -> SGraph:
    """The loop over columns adds 1 to each tile before its sum: the ones add up to the width."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    k.output(k.acc(_row_sum(k, k.op("add", k.input("X", [0], 1), _const(k, 1.0)))), "O", [0])
    return b.build(["O"])


def _width_as_literal(p: Program) -> SGraph:
    """sum(X + 1) as sum(X) + 64: right only because X is 64 wide."""
    return _rows_kernel(p, lambda k, t: k.op("add", _row_sum(k, t["X"]), _const(k, 64.0)), {"X": [0]})


def _chunks_carry_their_constants(p: Program) -> SGraph:
    """Kernel 1 splits the columns of X and Y into gz chunks, each summing (X + 1) and (Y + 1)
    over its chunk; kernel 2 sums the chunks: every one is counted once."""
    b = SGraphBuilder.for_program(p)
    k1 = b.graph(grid=[("x", "gx"), ("z", "gz")])
    xt, yt, one = k1.input("X", [0, 1], None), k1.input("Y", [0, 1], None), _const(k1, 1.0)
    part = k1.op("add", _row_sum(k1, k1.op("add", xt, one)), _row_sum(k1, k1.op("add", yt, one)))
    k1.output(k1.acc(part), "P", [0, 1])
    k2 = b.graph(grid=[("u", "hu")], loop=("z", "gz"))
    k2.output(k2.acc(k2.input("P", [0], 1)), "O", [0])
    return b.build(["O"])


def _vector_over_rows() -> Program:
    return _program("vector_over_rows", {"X": (16, 64), "V": (64,)}, lambda p, x, v: p.sum(x + v, 0, keepdim=True))


def _vector_added_per_row_tile(p: Program) -> SGraph:
    """The grid over columns, the loop over rows: V added to each tile of rows, then summed."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    xv = k.op("add", k.input("X", [1], 0), k.input("V", [0], None))
    k.output(k.acc(_row_sum(k, xv, dim=0)), "O", [1])
    return b.build(["O"])


CORRECT: dict[str, Case] = {c.name: c for c in [
    Case("x * rsqrt(v) for x / sqrt(v)", _x_over_sqrt_v, _x_times_rsqrt_v),
    Case("rms_norm as x * rsqrt(mean(x*x) + eps)", _rms_norm, _rms_norm_rsqrt),
    Case("rms_norm over a loop: concat tiles, mean of tile mean squares", _rms_norm, _rms_norm_looped),
    Case("rms_norm in two kernels: mean squares, then divide", _rms_norm, _rms_norm_two_kernels),
    Case("silu spelled a * sigmoid(a)", _silu_matmul, _silu_as_product),
    Case("silu spelled a / (1 + exp(-a))", _silu_matmul, _silu_as_quotient),
    Case("X @ (A @ B) as (X @ A) @ B", _chain, _chain_left_first),
    # the lora workload's reference: D = X @ A in a library matmul, then X @ W + D @ B in one
    # kernel whose loop walks both contractions at once
    Case("X @ (W + A @ B) as X @ W + (X @ A) @ B", lambda: _lora_program(True), reference_lora),
    Case("LoRA: library down-projection, fused up-projection", lambda: _lora_program(False), reference_lora),
    Case("LoRA: graph down-projection, main product taken whole", lambda: _lora_program(False),
         _lora_graph_down_sgraph),
    Case("(X * 0.5) @ W as X @ (W * 0.5) tile by tile", lambda: _scaled_matmul("left"), _scale_on_weight_tiles),
    Case("(X * 0.5) @ W as (X @ W) * 0.5 after the loop", lambda: _scaled_matmul("left"), _scale_after_loop),
    Case("(X @ W) * 0.5 as X @ (W * 0.5) tile by tile", lambda: _scaled_matmul("right"), _scale_on_weight_tiles),
    Case("(X / S) @ W as (X @ W) / S", _row_scaled_matmul, _row_division_after),
    Case("mean over a loop of constant size 2, partial means averaged", _row_mean, _mean_of_two_halves),
    Case("split-K merged by a loop over the same axis", _split_k, lambda p: _split_k_merge(p, "z")),
    Case("split-K merged by a renamed loop", _split_k, lambda p: _split_k_merge(p, "w")),
    Case("row sum of exp taken after the loop (concat)", _row_sum_exp, _sum_after_loop),
    Case("row max taken after the loop (concat)", row_reduction, _row_max_after_loop),
    Case("row sums of exp split over two kernels", _row_sum_exp, lambda p: _row_sums_in_chunks(p, "sum", of_exp=True)),
    Case("row means split over two kernels", _row_mean, lambda p: _row_sums_in_chunks(p, "mean", of_exp=False)),
    Case("matmul with the grid over rows instead of columns", _matmul_program, _matmul_over_rows),
    Case("X @ W as (-X) @ (-W)", _matmul_program, _matmul_negated_twice),
    Case("(X @ W)^T as a transposed view of the kernel's output", _transposed_product, _transposed_output),
    Case("(X @ W)^T as W^T @ X^T through views", _transposed_product, _transposed_operands),
    Case("batched matmul over batch and rows", _batched_matmul, _batched_over_batch_and_rows),
    Case("column mean: grid over columns, loop over rows", _column_mean, _column_mean_over_rows_loop),
    Case("row sums of a transposed input, reduced as stored", _sum_of_transposed, _sum_over_stored_rows),
    Case("mean(X + 1) as mean(X) + 1", _mean_plus_one, _mean_then_one),
    Case("sum(X * 3) as sum(X) * 3", _scaled_sum, _scale_after_sum),
    Case("sum(X) * S as sum(X * S)", _row_scaled_sum, _scale_before_sum),
    Case("mean over rows of column means as means of row means", _mean_of_means, _means_other_order),
    Case("X - mean(X) over a loop", _centered, _centered_over_loop),
    Case("softmax as exp(x) / sum(exp(x)), no max subtracted", _softmax, _softmax_without_max),
    Case("attention in one kernel, loop over keys", _attention, _attention_one_kernel),
    Case("exp(X + Y) as exp(X) * exp(Y)", _exp_of_sum, _product_of_exps),
    Case("X - Y as X + (-Y)", _difference, _plus_negated),
    Case("(X + Y) + Z as X + (Z + Y)", _three_sum, _regrouped_three_sum),
    Case("(X + Y) @ W as X @ W + Y @ W", _sum_matmul, _distributed_matmul),
    Case("(X + Y) @ W with the sum inside the loop", _sum_matmul, _summed_operands_in_loop),
    Case("row sums of X @ W + B as X @ rowsum(W) + sum(B)", _reduced_biased_product("sum"),
         _reduced_on_the_weights("sum")),
    Case("row means of X @ W + B as X @ rowmean(W) + mean(B)", _reduced_biased_product("mean"),
         _reduced_on_the_weights("mean")),
    *[Case(f"row sums of (X @ W) {sym} S as X @ rowsum(W {sym} S)", partial(_reduced_column_scaled_product, op),
           _scaled_weight_row_sums(op)) for op, sym in (("mul", "*"), ("div", "/"))],
    Case("relu(X) @ W, grid over rows, loop over K", _relu_matmul, _relu_in_loop),
    Case("gated MLP: (X @ W2) * silu(X @ W1)", _gated_mlp,
         lambda p: _gated_mlp_sgraph(p, lambda k, a1, a2: k.after("mul", a2, k.after("silu", a1)))),
    Case("gated MLP: (a1 * a2) * sigmoid(a1)", _gated_mlp,
         lambda p: _gated_mlp_sgraph(p, lambda k, a1, a2: k.after("mul", k.after("mul", a1, a2),
                                                                 k.after("sigmoid", a1)))),
    Case("gated MLP: library projections, elementwise kernel", _gated_mlp, _gated_mlp_two_stages),
    Case("sum(X + 1) over a loop, 1 added to each tile", _row_sum_plus_one, _one_added_per_tile),
    Case("sum(X + 1) + sum(Y + 1) split over two kernels, each chunk with its ones",
         lambda: _biased_row_sums("split", 64, 32, "one"), _chunks_carry_their_constants),
    Case("a (64,) vector added to each row tile of a loop", _vector_over_rows, _vector_added_per_row_tile),
    Case("two untied dims of equal extent walked by one loop", _untied_equal_widths, _one_loop_over_both_widths),
    Case("two untied dims of equal extent: a constant traded between them", _untied_equal_widths,
         lambda p: _wrong_row_sums_sgraph(p, "one", True), every_size=False),
    Case("sum(X + 1) as sum(X) + 64, the width as a literal", _row_sum_plus_one, _width_as_literal, every_size=False),
]}
