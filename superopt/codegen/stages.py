"""Stage emitters: each turns one step of a block graph into C++ that all 128 threads run.

A `Stage` records which shared-memory tiles it reads and writes, so the kernel assembler can put
a `__syncthreads()` exactly where one thread may read what another wrote (or overwrite what
another still reads). Mappings of work to threads:
- element loops: element i goes to thread i mod 128 (coalesced, conflict-free);
- rows (reductions, rms_norm, softmax, CUDA-core matmul outputs): a group of LANES consecutive
  lanes of a warp shares one row and combines its partial results with warp shuffles; every thread
  runs the same number of row steps so that whole warps always meet at a shuffle;
- WMMA: each warp owns 16x16 output fragments, round robin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from superopt.codegen.context import WMMA_TILE, KernelContext
from superopt.codegen.layout import VECTOR_TYPES, strides, tile_runs, vector_bytes
from superopt.codegen.prelude import C_TYPE, NEG_FLT_MAX, float_literal, formula
from superopt.codegen.program import THREADS_PER_BLOCK as THREADS
from superopt.codegen.values import Space, Values
from superopt.dtypes import dtype as get_dtype
from superopt.ops import Op, normalize_dim
from superopt.sgraph import AccKind, Accumulator, BlockInput, BlockOp, BlockOutput, stored_order

WARP = 32
# Row loops are unrolled a little for ILP, not fully: a fully unrolled first pass of a
# normalization would keep every element in registers until the second pass (and spill).
UNROLL = "#pragma unroll 4"
UNROLL_MMA = "#pragma unroll 2"  # two k-steps of fragments in flight, not all of them
MAX_ROWS_PER_THREAD = 8


@dataclass(frozen=True)
class Stage:
    comment: str
    lines: tuple[str, ...]
    reads: frozenset[str]
    writes: frozenset[str]


def indent(lines: list[str] | tuple[str, ...], n: int = 1) -> list[str]:
    pad = "  " * n
    return [pad + ln if ln else ln for ln in lines]


def _stage(comment: str, lines: list[str], reads: set[str], writes: set[str]) -> Stage:
    return Stage(comment, tuple(lines), frozenset(reads), frozenset(writes))


def element_loop(n: int, body: list[str], var: str = "i") -> list[str]:
    return [f"for (int {var} = tid; {var} < {n}; {var} += {THREADS}) {{", *indent(body), "}"]


def lanes_for(items: int, extent: int) -> int:
    """Lanes sharing one row: as many as keep the block busy, at most a warp and the row length."""
    lanes = 1
    while lanes < WARP and 2 * lanes * items <= THREADS and 2 * lanes <= extent:
        lanes *= 2
    return lanes


def _const_terms(terms: list[tuple[str, int]]) -> str:
    parts = [v if c == 1 else f"{v} * {c}" for v, c in terms if c != 0]
    return " + ".join(parts) or "0"


# -- device memory <-> shared memory ----------------------------------------------------------


def _tile_origin(ctx: KernelContext, inp: BlockInput, gst: tuple[int, ...]) -> list[tuple[str, int]]:
    """The element offset of this block's and iteration's input tile, as (variable, stride) terms
    over a tensor whose dims have element strides `gst`."""
    full = ctx.inst.shape(inp.tensor)
    terms: list[tuple[str, int]] = []
    for axis, g, d in zip(ctx.block.grid, ctx.grid, inp.imap, strict=True):
        if d is not None:
            terms.append((ctx.axis_vars[axis.name], full[d] // g * gst[d]))
    if inp.fmap is not None:
        split = math.prod(g for g, d in zip(ctx.grid, inp.imap, strict=True) if d == inp.fmap)
        terms.append((ctx.loop_var, full[inp.fmap] // (split * ctx.loop) * gst[inp.fmap]))
    return terms


def load(ctx: KernelContext, inp: BlockInput) -> Stage:
    """Copy an input tile into shared memory, cooperatively, in the widest aligned vectors."""
    if inp.tensor in ctx.inst.sgraph.views:
        return _load_view(ctx, inp)
    if inp.tensor in ctx.inst.sgraph.reshaped_views:
        return _load_reshaped_view(ctx, inp)
    full = ctx.inst.shape(inp.tensor)
    tile = ctx.tile(inp.id)
    runs = tile_runs(tile, full)
    eb = get_dtype(ctx.inst.sgraph.info.dtypes[inp.tensor]).nbytes
    vb = vector_bytes(runs.run, eb)
    per = vb // eb
    gst = strides(full)
    terms = _tile_origin(ctx, inp, gst)
    n_vec = math.prod(tile) // per
    vec_per_run = runs.run // per
    outer = Space.elements(tile[: runs.split_dim], "r")
    goff = [f"{outer.coord(d)} * {gst[d]}" for d in range(runs.split_dim) if tile[d] != 1]
    within = "v" if runs.rows == 1 else (f"(v % {vec_per_run})" if vec_per_run > 1 else "")
    src_terms = ["base", *goff] + ([f"{within} * {per}" if per > 1 else within] if within else [])
    body = []
    if goff:
        body.append(f"const int r = v / {vec_per_run};" if vec_per_run > 1 else "const int r = v;")
        body += outer.decls
    dst = f"{ctx.smem(inp.id)} + v * {per}" if per > 1 else f"{ctx.smem(inp.id)} + v"
    src = f"{ctx.gname(inp.tensor)} + " + " + ".join(src_terms)
    if vb in VECTOR_TYPES and per > 1:
        vt = VECTOR_TYPES[vb]
        body.append(f"*reinterpret_cast<{vt}*>({dst}) = *reinterpret_cast<const {vt}*>({src});")
    else:
        body.append(f"*({dst}) = *({src});")
    what = f"{runs.rows} run(s) of {runs.run}, {vb}-byte copies"
    lines = ["{", f"  const int base = {_const_terms(terms)};", *indent(element_loop(n_vec, body, "v")), "}"]
    return _stage(f"load {inp.id} <- {inp.tensor} ({what})", lines, set(), {inp.id})


def _load_view(ctx: KernelContext, inp: BlockInput) -> Stage:
    """Copy a tile of a transposed view (`SGraph.views`) into shared memory, row-major in the
    view's dim order, reading the stored tensor's memory: threads walk the tile in the stored
    order (consecutive threads, consecutive addresses) and scatter into the tile."""
    stored, perm = ctx.inst.sgraph.views[inp.tensor]
    sst = strides(ctx.inst.shape(stored))
    tile = ctx.tile(inp.id)
    tst = strides(tile)
    walk = Space.elements(stored_order(tile, perm))
    src = [f"{walk.coord(d)} * {sst[d]}" for d in range(len(perm)) if walk.shape[d] != 1]
    dst = [f"{walk.coord(d)} * {st}" for d, st in enumerate(stored_order(tst, perm)) if walk.shape[d] != 1]
    copy = f"{ctx.smem(inp.id)}[{' + '.join(dst) or '0'}] = {ctx.gname(inp.tensor)}[{' + '.join(['base', *src])}];"
    view_strides = tuple(sst[p] for p in perm)
    lines = ["{", f"  const int base = {_const_terms(_tile_origin(ctx, inp, view_strides))};",
             *indent(element_loop(math.prod(tile), [*walk.decls, copy])), "}"]
    return _stage(f"load {inp.id} <- {inp.tensor} (a view of {stored}, dims {list(perm)}: element copies)",
                  lines, set(), {inp.id})


def _load_reshaped_view(ctx: KernelContext, inp: BlockInput) -> Stage:
    """Copy a tile of a reshaped view (`SGraph.reshaped_views`) into shared memory, row-major:
    an element's row-major index in the reshaped tensor is its index in the transposed view it
    reshapes, whose dims address the stored tensor's memory with permuted strides."""
    view = ctx.inst.sgraph.reshaped_views[inp.tensor]
    stored, perm = ctx.inst.sgraph.views[view]
    sst, shape = strides(ctx.inst.shape(stored)), ctx.inst.shape(view)
    full, tile = ctx.inst.shape(inp.tensor), ctx.tile(inp.id)
    fst, vst = strides(full), strides(shape)
    walk = Space.elements(tile)
    linear = " + ".join(["base", *(f"{walk.coord(d)} * {fst[d]}" for d in range(len(tile)) if tile[d] != 1)])
    address = []
    for d, n in enumerate(shape):
        if n != 1:  # the view's index along d (the first needs no modulo: l is below the size)
            index = (f"l / {vst[d]}" if vst[d] > 1 else "l") + (f" % {n}" if d else "")
            address.append(f"({index}) * {sst[perm[d]]}")
    copy = f"{ctx.smem(inp.id)}[i] = {ctx.gname(inp.tensor)}[{' + '.join(address) or '0'}];"
    lines = ["{", f"  const int base = {_const_terms(_tile_origin(ctx, inp, fst))};",
             *indent(element_loop(math.prod(tile), [*walk.decls, f"const int l = {linear};", copy])), "}"]
    return _stage(f"load {inp.id} <- {inp.tensor} (a reshape of {view}, a view of {stored}, dims {list(perm)}: "
                  "element copies)", lines, set(), {inp.id})


def store(ctx: KernelContext, out: BlockOutput) -> Stage:
    """Write an output tile where the omap puts this block, converting to the tensor's dtype."""
    full = ctx.inst.shape(out.tensor)
    tile = ctx.tile(out.source)
    gst = strides(full)
    terms = [
        (ctx.axis_vars[axis.name], tile[d] * gst[d]) for axis, d in zip(ctx.block.grid, out.omap, strict=True)
    ]
    space = Space.elements(tile)
    vals = Values(space, ctx.ref)
    value = vals.of(out.source)
    runs = tile_runs(tile, full)
    if runs.split_dim == 0:
        where = ["i"]
    else:
        where = [f"{space.coord(d)} * {gst[d]}" for d in range(runs.split_dim) if tile[d] != 1]
        if runs.run > 1:
            where.append(f"i % {runs.run}")
    stmt = f"so_st({ctx.gname(out.tensor)} + base + {' + '.join(where) or '0'}, {value});"
    loop = element_loop(math.prod(tile), vals.body([stmt]))
    lines = ["{", f"  const int base = {_const_terms(terms)};", *indent(loop), "}"]
    return _stage(f"store {out.tensor} <- {out.source}", lines, vals.leaves, set())


# -- elementwise and accumulators -------------------------------------------------------------


def elementwise(ctx: KernelContext, op: BlockOp) -> Stage:
    shape = ctx.tile(op.id)
    vals = Values(Space.elements(shape), ctx.ref)
    value = formula(op.op, [vals.of(i) for i in op.inputs])
    stmt = f"so_st({ctx.smem(op.id)} + i, {value});"
    return _stage(f"{op.id} = {op.op}({', '.join(op.inputs)})", element_loop(math.prod(shape), vals.body([stmt])),
                  vals.leaves, {op.id})


def zero(ctx: KernelContext, acc: Accumulator) -> Stage:
    n = math.prod(ctx.tile(acc.id))
    return _stage(f"{acc.id} = 0", element_loop(n, [f"{ctx.smem(acc.id)}[i] = 0.0f;"]), set(), {acc.id})


def accumulate(ctx: KernelContext, acc: Accumulator) -> Stage:
    src = ctx.tile(acc.source)
    space = Space.elements(src)
    vals = Values(space, ctx.ref)
    value = vals.of(acc.source)
    if acc.kind == AccKind.CONCAT:
        assert acc.dim is not None
        ast = strides(ctx.tile(acc.id))
        idx = [space.coord(d) if ast[d] == 1 else f"{space.coord(d)} * {ast[d]}" for d in range(len(src))
               if src[d] != 1]
        idx.append(f"{ctx.loop_var} * {src[acc.dim] * ast[acc.dim]}")
        stmt = f"{ctx.smem(acc.id)}[{' + '.join(idx)}] = {value};"
        loop = element_loop(math.prod(src), vals.body([stmt]))
        return _stage(f"{acc.id}: concat {acc.source} along dim {acc.dim}", loop, vals.leaves, {acc.id})
    stmt = f"{ctx.smem(acc.id)}[i] += {value};"
    return _stage(f"{acc.id} += {acc.source}", element_loop(math.prod(src), vals.body([stmt])),
                  vals.leaves | {acc.id}, {acc.id})


def finish_mean(ctx: KernelContext, acc: Accumulator) -> Stage:
    n = math.prod(ctx.tile(acc.id))
    a = ctx.smem(acc.id)
    return _stage(f"{acc.id}: mean over {ctx.loop} iterations",
                  element_loop(n, [f"{a}[i] = {a}[i] / {float_literal(ctx.loop)};"]), {acc.id}, {acc.id})


# -- rows: reductions, normalizations, CUDA-core matmul ---------------------------------------


def _row_scaffold(rows: int, lanes: int, body: list[str]) -> list[str]:
    """Rows handed to groups of `lanes` lanes; uniform trip count so whole warps reach shuffles."""
    per = THREADS // lanes
    padded = -(-rows // per) * per
    first = "tid" if lanes == 1 else f"tid / {lanes}"
    head = [f"for (int row = {first}; row < {padded}; row += {per}) {{"]
    guard = [] if padded == rows else [f"const bool active = row < {rows};"]
    return [*head, *indent(guard + body), "}"]


def _active(rows: int, lanes: int) -> str:
    per = THREADS // lanes
    return "" if -(-rows // per) * per == rows else "active"


def _pass(rows: int, lanes: int, acc: str, init: str, inner: list[str], extent: int, reduce: str) -> list[str]:
    """One pass over a row: each lane folds its strided share into `acc`, then the group combines."""
    active = _active(rows, lanes)
    start = "0" if lanes == 1 else f"tid % {lanes}"
    loop = [UNROLL, f"for (int k = {start}; k < {extent}; k += {lanes}) {{", *indent(inner), "}"]
    if active:
        loop = [f"if ({active}) {{", *indent(loop), "}"]
    lines = [f"float {acc} = {init};", *loop]
    if lanes > 1:
        lines.append(f"{acc} = so_group_{reduce}<{lanes}>({acc});")
    return lines


def _leader(rows: int, lanes: int) -> str:
    conds = [c for c in (_active(rows, lanes), "" if lanes == 1 else f"tid % {lanes} == 0") if c]
    return " && ".join(conds)


def _guarded(cond: str, stmts: list[str]) -> list[str]:
    return [f"if ({cond}) {{", *indent(stmts), "}"] if cond else stmts


def _rows_of(ctx: KernelContext, op: BlockOp) -> tuple[str, tuple[int, ...], int, int, int, int]:
    """An op along one dim of its operand's tile: the operand, its tile shape, the dim, its extent,
    the number of rows (everything else) and the lanes that share a row."""
    x = op.inputs[0]
    shape = ctx.tile(x)
    dim = normalize_dim(op.attrs["dim"], len(shape))
    extent = shape[dim]
    rows = math.prod(shape) // extent
    return x, shape, dim, extent, rows, lanes_for(rows, extent)


def reduction(ctx: KernelContext, op: BlockOp) -> Stage:
    """sum / mean / max over one dim (keepdim or not: the output is laid out row by row either way)."""
    x, shape, dim, extent, rows, lanes = _rows_of(ctx, op)
    vals = Values(Space.rows(shape, dim), ctx.ref)
    v = vals.of(x)
    is_max = op.op == Op.MAX
    fold = f"acc = so_max(acc, {v});" if is_max else f"acc += {v};"
    body = _pass(rows, lanes, "acc", NEG_FLT_MAX if is_max else "0.0f", vals.body([fold]), extent,
                 "max" if is_max else "sum")
    result = f"acc / {float_literal(extent)}" if op.op == Op.MEAN else "acc"
    body += _guarded(_leader(rows, lanes), [f"so_st({ctx.smem(op.id)} + row, {result});"])
    comment = f"{op.id} = {op.op}({x}, dim={dim}): {rows} rows of {extent}, {lanes} lanes per row"
    return _stage(comment, _row_scaffold(rows, lanes, body), vals.leaves, {op.id})


def normalization(ctx: KernelContext, op: BlockOp) -> Stage:
    """rms_norm (x / sqrt(mean(x*x) + eps)) or softmax (exp(x - max) / sum) along one dim."""
    x, shape, dim, extent, rows, lanes = _rows_of(ctx, op)
    out = ctx.smem(op.id)
    space_out = Space.rows(shape, dim)
    out_index = space_out.index(ctx.tile(op.id))
    leaves: set[str] = set()

    def read() -> Values:
        vals = Values(Space.rows(shape, dim), ctx.ref)
        vals.of(x)
        leaves.update(vals.leaves)
        return vals

    body: list[str] = []
    if op.op == Op.RMS_NORM:
        v1 = read()
        body += _pass(rows, lanes, "ss", "0.0f", v1.body([f"ss += so_square({v1.of(x)});"]), extent, "sum")
        eps = float_literal(op.attrs["eps"])
        body.append(f"const float denom = sqrtf(ss / {float_literal(extent)} + {eps});")
        v2 = read()
        write = [*v2.space.decls, *v2.lets, *space_out.decls, f"so_st({out} + {out_index}, {v2.of(x)} / denom);"]
    else:
        v1 = read()
        body += _pass(rows, lanes, "mx", NEG_FLT_MAX, v1.body([f"mx = so_max(mx, {v1.of(x)});"]), extent, "max")
        v2 = read()
        body += _pass(rows, lanes, "se", "0.0f", v2.body([f"se += expf({v2.of(x)} - mx);"]), extent, "sum")
        v3 = read()
        value = f"expf({v3.of(x)} - mx) / se"
        write = [*v3.space.decls, *v3.lets, *space_out.decls, f"so_st({out} + {out_index}, {value});"]
    start = "0" if lanes == 1 else f"tid % {lanes}"
    loop = [UNROLL, f"for (int k = {start}; k < {extent}; k += {lanes}) {{", *indent(_dedupe(write)), "}"]
    body += _guarded(_active(rows, lanes), loop)
    comment = f"{op.id} = {op.op}({x}, dim={dim}): {rows} rows of {extent}, {lanes} lanes per row"
    return _stage(comment, _row_scaffold(rows, lanes, body), leaves, {op.id})


def _dedupe(lines: list[str]) -> list[str]:
    """Drop repeated declarations (the output and input walk the same coordinates)."""
    seen: set[str] = set()
    out = []
    for ln in lines:
        if ln.startswith("const int ") and ln in seen:
            continue
        seen.add(ln)
        out.append(ln)
    return out


def _matmul_dims(ctx: KernelContext, op: BlockOp) -> tuple[int, int, int, int]:
    a, b = (ctx.tile(i) for i in op.inputs)
    return math.prod(a[:-2]), a[-2], a[-1], b[-1]


def matmul(ctx: KernelContext, op: BlockOp, targets: list[Accumulator]) -> Stage:
    """C = A @ B (batched over leading dims) into its stored tile, or added into `targets`."""
    return _wmma(ctx, op, targets) if ctx.wmma(op) else _cuda_cores(ctx, op, targets)


def _cuda_cores(ctx: KernelContext, op: BlockOp, targets: list[Accumulator]) -> Stage:
    """Register-blocked: a thread holds `rows` outputs of one column (independent accumulators that
    share each B element it loads); a group of lanes splits K and combines with shuffles."""
    batch, m, k, n = _matmul_dims(ctx, op)
    a, b = op.inputs
    rows = max(r for r in range(1, MAX_ROWS_PER_THREAD + 1) if m % r == 0)
    groups = m // rows
    strips = batch * groups * n
    lanes = lanes_for(strips, k)
    locate = [f"const int bi = row / {groups * n};"] if batch > 1 else []
    locate.append(f"const int mg = row / {n} % {groups};" if batch > 1 else f"const int mg = row / {n};")
    locate.append(f"const int ni = row % {n};")
    batch_a, batch_b = (f"bi * {m * k} + ", f"bi * {k * n} + ") if batch > 1 else ("", "")
    start = "0" if lanes == 1 else f"tid % {lanes}"
    dot = [
        f"const {ctx.ctype(a)}* a_rows = {ctx.smem(a)} + {batch_a}mg * {rows * k};",
        f"const {ctx.ctype(b)}* b_col = {ctx.smem(b)} + {batch_b}ni;",
        f"float dot[{rows}];",
        f"for (int r = 0; r < {rows}; ++r) dot[r] = 0.0f;",
    ]
    inner = [
        UNROLL,
        f"for (int k = {start}; k < {k}; k += {lanes}) {{",
        f"  const float bk = so_f(b_col[k * {n}]);",
        f"  for (int r = 0; r < {rows}; ++r) dot[r] += so_f(a_rows[r * {k} + k]) * bk;",
        "}",
    ]
    active = _active(strips, lanes)
    dot += _guarded(active, inner)
    if lanes > 1:
        dot.append(f"for (int r = 0; r < {rows}; ++r) dot[r] = so_group_sum<{lanes}>(dot[r]);")
    out = f"({'bi * ' + str(m) + ' + ' if batch > 1 else ''}mg * {rows} + r) * {n} + ni"
    if targets:
        writes = {t.id for t in targets}
        stmts = [f"for (int r = 0; r < {rows}; ++r) {ctx.smem(t.id)}[{out}] += dot[r];" for t in targets]
    else:
        writes = {op.id}
        stmts = [f"for (int r = 0; r < {rows}; ++r) so_st({ctx.smem(op.id)} + {out}, dot[r]);"]
    body = [*locate, *dot, *_guarded(_leader(strips, lanes), stmts)]
    into = f" (added into {', '.join(t.id for t in targets)})" if targets else ""
    comment = (f"{op.id} = {a} @ {b}{into}: {batch} x ({m} x {k}) @ ({k} x {n}) on CUDA cores, "
               f"{rows} rows x 1 column per thread, {lanes} lanes per column strip")
    reads = {a, b} | (writes if targets else set())
    return _stage(comment, _row_scaffold(strips, lanes, body), reads, writes)


def _wmma(ctx: KernelContext, op: BlockOp, targets: list[Accumulator]) -> Stage:
    batch, m, k, n = _matmul_dims(ctx, op)
    a, b = op.inputs
    mt, nt = m // WMMA_TILE, n // WMMA_TILE
    frags = batch * mt * nt
    et = C_TYPE[ctx.dt]
    locate = []
    if batch > 1:
        locate.append(f"const int bi = frag / {mt * nt};")
    locate.append(f"const int fm = frag / {nt} % {mt};" if batch > 1 else f"const int fm = frag / {nt};")
    locate.append(f"const int fn = frag % {nt};")
    bo = "bi * {} + ".format
    a_ptr = f"{ctx.smem(a)} + " + (bo(m * k) if batch > 1 else "") + f"fm * {WMMA_TILE * k} + kk"
    b_ptr = f"{ctx.smem(b)} + " + (bo(k * n) if batch > 1 else "") + f"kk * {n} + fn * {WMMA_TILE}"
    c_off = (bo(m * n) if batch > 1 else "") + f"fm * {WMMA_TILE * n} + fn * {WMMA_TILE}"
    mma = [
        UNROLL_MMA,
        f"for (int kk = 0; kk < {k}; kk += {WMMA_TILE}) {{",
        f"  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, {et}, nvcuda::wmma::row_major> fa;",
        f"  nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, {et}, nvcuda::wmma::row_major> fb;",
        f"  nvcuda::wmma::load_matrix_sync(fa, {a_ptr}, {k});",
        f"  nvcuda::wmma::load_matrix_sync(fb, {b_ptr}, {n});",
        "  nvcuda::wmma::mma_sync(fc, fa, fb, fc);",
        "}",
    ]
    body = [*locate, "nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> fc;"]
    dests = [ctx.smem(t.id) for t in targets] or [ctx.smem(op.id)]
    for i, dest in enumerate(dests):
        if targets:
            body.append(f"nvcuda::wmma::load_matrix_sync(fc, {dest} + {c_off}, {n}, nvcuda::wmma::mem_row_major);")
        elif i == 0:
            body.append("nvcuda::wmma::fill_fragment(fc, 0.0f);")
        body += mma
        body.append(f"nvcuda::wmma::store_matrix_sync({dest} + {c_off}, fc, {n}, nvcuda::wmma::mem_row_major);")
    lines = [f"for (int frag = warp; frag < {frags}; frag += {THREADS // WARP}) {{", *indent(body), "}"]
    into = f" (added into {', '.join(t.id for t in targets)})" if targets else ""
    comment = (f"{op.id} = {a} @ {b}{into}: {batch} x ({m} x {k}) @ ({k} x {n}) on tensor cores, "
               f"{frags} 16x16 fragments over {THREADS // WARP} warps")
    writes = {t.id for t in targets} or {op.id}
    reads = {a, b} | ({t.id for t in targets})
    return _stage(comment, lines, reads, writes)
