"""The `superopt` command line (Typer). Errors a user can cause print one line and exit 2.

The app's --help text is set below (`HELP`), not taken from this docstring: notes for developers
are not the user's.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from superopt import workloads
from superopt.api import NoCandidate, check_defined, resolve_target
from superopt.cli_progress import Throttle, count_progress, search_progress, search_text
from superopt.config import (
    BODY_TIMEOUT_S,
    DB_RETRY_S,
    DB_URL_ENV,
    DEFAULT_BUDGET_S,
    DEFAULT_CONFIG,
    DEFAULT_TARGET,
    HOSTS_ENV,
    LEASE_S,
    MAX_BODY_BYTES,
    MAX_LEASE_S,
    MAX_ROWS,
    POLL_S,
    SERVE_HOST,
    SERVE_PORT,
    TARGET_HELP,
    TOKEN_ENV,
    bound,
)
from superopt.core.errors import ClusterUnreachable
from superopt.db.errors import CacheIntegrityWarning, RequestError, StoreError
from superopt.instantiate import InstantiationError, instantiate, parse_params
from superopt.limits import LimitConfigError, printable, shown
from superopt.loading import LoadError, kind_of, load_onnx, load_program, load_sgraph, read_json
from superopt.ops import OpError
from superopt.program import Program, ProgramError
from superopt.render import render_program, render_sgraph
from superopt.search.space import UnsupportedProgram
from superopt.sgraph import SGraph, SGraphError, check_matches
from superopt.sizes import SizeError
from superopt.svg import render_svg
from superopt.targets import Target, TargetError
from superopt.targets import target as get_target

HELP = ("Find, prove and time the fastest fused GPU schedules of tensor programs; serve them from a "
        "kernel cache, over HTTP and through job workers.")


class Commands(TyperGroup):
    """superopt's command groups: a usage error (an unknown option, a value of the wrong type,
    a missing argument) is one `error:` line naming the command's --help, exit code 2, as every
    other error of the input is (`user_errors`), not Typer's usage text and boxed message."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with _one_line_usage_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with _one_line_usage_errors():
            return super().invoke(ctx)


# Click's, which Typer may carry a copy of: reached through the one Typer exports.
_UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


@contextmanager
def _one_line_usage_errors() -> Iterator[None]:
    try:
        yield
    except _UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":
            raise  # the help, printed already
        usage: Any = e  # Click's: a message, the command's context, an exit code
        where = f" (see '{usage.ctx.command_path} --help')" if usage.ctx is not None else ""
        err.print(f"error: {usage.format_message().rstrip('.')}{where}", markup=False)
        raise SystemExit(usage.exit_code) from None


app = typer.Typer(cls=Commands, no_args_is_help=True, add_completion=False, help=HELP)
# Piped output keeps whole table rows readable instead of Rich's 80-column default.
_WIDTH = None if sys.stdout.isatty() else 160
out = Console(highlight=False, soft_wrap=True, width=_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_WIDTH)

USER_ERRORS: tuple[type[Exception], ...] = (
    ProgramError, SGraphError, InstantiationError, LoadError, OpError, SizeError, StoreError, RequestError,
    NoCandidate, UnsupportedProgram, TargetError, ClusterUnreachable, LimitConfigError,
)
F = TypeVar("F", bound=Callable[..., Any])
# An sGraph handed on to the next command: the JSON file verify, run --sgraph and export --sgraph read.
SgraphOutOption = Annotated[Path | None, typer.Option(
    "--sgraph-out", help="also write the sGraph as JSON here (what verify, run --sgraph and export --sgraph read)")]
DbOption = Annotated[str | None, typer.Option(
    "--db", envvar=DB_URL_ENV, help="database URL or SQLite file (default: ~/.cache/superopt/superopt.db)",
)]


def _target_option(what: str) -> Any:
    """--target of every command that takes one: one default (config.DEFAULT_TARGET), one meaning."""
    return typer.Option(help=f"{what}; {TARGET_HELP}")


def _bound_option(name: str) -> Any:
    """A search bound as an option, its help and range from SearchConfig; its value is checked
    as a job request's is (superopt.jobspec.ConfigSpec), so both say the same."""
    meta = bound(name).metadata
    limits = f" ({meta['ge']} to {meta['le']})" if "ge" in meta else ""
    return typer.Option(help=f"{meta['description']}{limits}")


KernelOpsOption = Annotated[int, _bound_option("max_kernel_ops")]
BlockOpsOption = Annotated[int, _bound_option("max_block_ops")]
GridAxesOption = Annotated[int, _bound_option("max_grid_axes")]
BlockInputsOption = Annotated[int, _bound_option("max_block_inputs")]
ConcreteOption = Annotated[bool, _bound_option("concrete")]


def user_errors(fn: F) -> F:
    """Turn an error the user caused into one message and exit code 2 (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from sqlalchemy.exc import SQLAlchemyError

        from superopt.db.engine import read_only, reason

        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as e:
            err.print(f"error: {e}", markup=False)
            raise typer.Exit(2) from None
        except OSError as e:  # a file the system refuses: a name too long, a device, no permission
            where = f"{shown(e.filename)}: " if e.filename is not None else ""
            err.print(f"error: {where}{e.strerror or e}", markup=False)
            raise typer.Exit(2) from None
        except SQLAlchemyError as e:
            if not read_only(e):
                raise
            err.print(f"error: the database refuses writes ({reason(e)}); nothing was written", markup=False)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


@app.command()
@user_errors
def programs(as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False) -> None:
    """List the built-in workloads and their shapes."""
    rows: list[dict[str, Any]] = []
    for w in workloads.WORKLOADS.values():
        for label in w.shapes:
            p = w.program(label)
            rows.append({
                "name": w.name if label == w.default else f"{w.name}:{label}",
                "workload": w.name,
                "label": label,
                "default": label == w.default,
                "computation": w.computation,
                "inputs": {n.id: list(n.shape) for n in p.inputs},
                "dtype": p.dtype,
                "hash": p.canonical_hash(),
            })
    if as_json:
        emit_json(rows)
        return
    table = Table("name", "computation", "inputs", title="built-in workloads")
    for r in rows:
        shapes = " ".join(f"{k}{tuple(v)}" for k, v in r["inputs"].items())
        table.add_row(r["name"], r["computation"], shapes)
    out.print(table)


@app.command()
@user_errors
def show(
    spec: Annotated[str, typer.Argument(help="built-in workload, program JSON or ONNX file, or sGraph JSON file")],
    reference: Annotated[bool, typer.Option(help="show the workload's hand-written fused sGraph")] = False,
    baseline: Annotated[bool, typer.Option(help="show the program's unfused baseline sGraph")] = False,
    params: Annotated[str, typer.Option(help="symbol values to print with an sGraph, e.g. gx=8,F=4")] = "",
    winner: Annotated[bool, typer.Option(help="show the optimizer's best schedule (from the kernel cache, else "
                                              "searched as `superopt optimize` does)")] = False,
    target: Annotated[str, _target_option("target of --winner")] = DEFAULT_TARGET,
    db: DbOption = None,
    svg: Annotated[Path | None, typer.Option("--svg", help="write the sGraph's picture here (a program: its "
                                                           "unfused baseline)")] = None,
    sgraph_out: SgraphOutOption = None,
) -> None:
    """Print a program or an sGraph, draw the sGraph as SVG, or write it as JSON (--sgraph-out)."""
    values = parse_params(params) if params else None
    if Path(spec).is_file() and not spec.endswith(".onnx") and kind_of(read_json(spec)) == "sgraph":
        if winner:
            raise LoadError("--winner goes with a program (a built-in workload or a program file), not an sGraph")
        sg = load_sgraph(spec, Program(), spec)
    else:
        program = load_program(spec)
        if params and not (reference or baseline):
            raise LoadError("--params goes with an sGraph (a file, --reference or --baseline), not a program")
        if reference + baseline + winner > 1:
            raise LoadError("--reference, --baseline and --winner each show one sGraph: choose one")
        if winner:
            from superopt.api import optimize as run_optimize

            with search_progress(err, DEFAULT_BUDGET_S) as progress:
                result = run_optimize(program, target=target, db=db, progress=progress)
            _write_sgraph(sgraph_out, result.best.sgraph)
            if svg is not None:
                _write(svg, result.to_svg())
                err.print(f"wrote {svg}", markup=False)
            elif sgraph_out is None:
                out.print(render_sgraph(result.best.sgraph, result.best.params), markup=False)
            return
        if not (reference or baseline or svg or sgraph_out):
            out.print(render_program(program), markup=False)
            return
        sg = load_sgraph("reference" if reference else "baseline", program, spec)
    if values is not None:
        instantiate(sg, values, get_target("h100"))  # every symbol named, known and within its constraints
    _write_sgraph(sgraph_out, sg)
    if svg is not None:
        _write(svg, render_svg(sg, values))
        err.print(f"wrote {svg}", markup=False)
    if svg is None and sgraph_out is None:  # a file written is the answer, as --svg's is
        out.print(render_sgraph(sg, values), markup=False)


@app.command()
@user_errors
def check(file: Annotated[str, typer.Argument(help="program JSON file (or ONNX model file)")]) -> None:
    """Validate a program JSON file (finite at random inputs too) and print its canonical hash."""
    program = load_onnx(file) if file.endswith(".onnx") else Program.from_json(read_json(file))
    check_defined(program)
    out.print(f"{program.canonical_hash()}  {program.name}", markup=False)


@app.command("import")
@user_errors
def import_(
    file: Annotated[str, typer.Argument(help="ONNX model file (needs the onnx extra)")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="program JSON file to write (default: "
                                                                      "stdout)")] = None,
    name: Annotated[str | None, typer.Option(help="program name (default: the file's stem)")] = None,
) -> None:
    """Import an ONNX model as a program JSON file; its float initializers become inputs."""
    from superopt.loading import load_onnx

    program = load_onnx(file, name)
    if output is None:
        sys.stdout.write(program.dumps() + "\n")
        return
    _write(output, program.dumps() + "\n")
    out.print(f"wrote {output}: {program.canonical_hash()}  {program.summary()}", markup=False)


@app.command()
@user_errors
def run(
    spec: Annotated[str, typer.Argument(help="built-in workload or program JSON file")],
    sgraph: Annotated[str | None, typer.Option(
        help="sGraph JSON file or result report, 'reference', 'baseline', or 'winner' (the optimizer's, from the "
             "kernel cache, else searched as `superopt optimize` does) [default: reference for a built-in "
             "workload, else baseline]", show_default=False)] = None,
    params: Annotated[str, typer.Option(help="symbol values, e.g. gx=8,F=4; those not given: a winner's own, "
                                             "else the cost model's best, as `export` takes")] = "",
    target: Annotated[str, _target_option("target whose limits the parameters must meet")] = DEFAULT_TARGET,
    seed: Annotated[int, typer.Option(min=0, max=2**32 - 1, help="seed of the random inputs")] = 0,
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Run an sGraph in the interpreter; print its max relative error against the float64 reference."""
    from superopt.interpreter import run_float
    from superopt.reference import inputs_and_reference, max_rel_err

    program = load_program(spec)
    tgt = resolve_target(target).target
    chosen = parse_params(params) if params else {}
    if sgraph == "winner":
        from superopt.api import optimize as run_optimize

        with search_progress(err, DEFAULT_BUDGET_S) as progress:
            best = run_optimize(program, target=target, db=db, progress=progress).best
        sg, own = best.sgraph, best.params
    else:
        sg = load_sgraph(sgraph or ("reference" if workloads.is_builtin(spec) else "baseline"), program, spec)
        own = None
    check_matches(sg, program)
    if sg.symbols - set(chosen):  # the others: the winner's own, else the cost model's best
        chosen = {**(own if own is not None else _best_params(sg, tgt)), **chosen}
    inst = instantiate(sg, chosen, tgt)
    inputs, refs = inputs_and_reference(program, seed)
    outs = run_float(inst, inputs)
    errs = [max_rel_err(o, r) for o, r in zip(outs, refs, strict=True)]
    tol = max(_tolerance(program), 0.0)
    result = {"program": program.name, "sgraph": sg.name, "params": dict(inst.values), "seed": seed,
              "max_rel_err": max(errs), "tolerance": tol, "ok": max(errs) <= tol}
    if as_json:
        emit_json(result)
    else:
        verdict = "within" if result["ok"] else "OUTSIDE"
        out.print(f"{sg.name} {inst.params_text() or '(no params)'}: max rel err {max(errs):.3e} "
                  f"({verdict} the {program.dtype} tolerance {tol:.0e})", markup=False)
    if not result["ok"]:
        raise typer.Exit(1)


@app.command()
@user_errors
def verify(
    spec: Annotated[str, typer.Argument(help="built-in workload or program JSON file")],
    sgraph: Annotated[str, typer.Argument(help="sGraph JSON file, or 'reference' / 'baseline'")],
    params: Annotated[str, typer.Option(help="also check at the program's shapes with these values")] = "",
    target: Annotated[str, _target_option("target whose limits instantiations must meet")] = DEFAULT_TARGET,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Prove an sGraph equal to a program: finite fields, e-graph proof, float check."""
    from superopt.verifier.verify import verify as run_verify

    program = load_program(spec)
    sg = load_sgraph(sgraph, program, spec)
    values = parse_params(params) if params else None
    verdict = run_verify(program, sg, target=resolve_target(target).target, params=values)
    if as_json:
        emit_json(verdict.to_json())
    else:
        table = Table("layer", "passed", "ms", "detail")
        for layer in verdict.layers:
            detail = layer["detail"]
            if layer["layer"] == "egraph":
                detail = (f"{detail['reason']}: {detail['rule_applications']} rule applications, "
                          f"{detail['enodes']} e-nodes")
            table.add_row(layer["layer"], "yes" if layer["passed"] else "NO", f"{layer['ms']:.1f}", str(detail))
        out.print(table)
        out.print(f"{sg.name}: {'PROVED' if verdict.proved else 'NOT PROVED'} "
                  f"(e-graph {verdict.egraph}, finite-field error bound {verdict.finite_field_error_bound:.1e}, "
                  f"float max rel err {verdict.float_max_rel_err:.2e})", markup=False)
        if verdict.max_treatment:
            out.print(verdict.max_treatment, markup=False)
    if not verdict.proved:
        raise typer.Exit(1)


@app.command()
@user_errors
def optimize(
    spec: Annotated[str, typer.Argument(help="built-in workload or program JSON file")],
    target: Annotated[str, _target_option("target to search and time for")] = DEFAULT_TARGET,
    budget_s: Annotated[float, typer.Option("--budget-s", help="search time budget (anytime: best so far)")] = (
        DEFAULT_BUDGET_S),
    max_states: Annotated[int | None, typer.Option("--max-states", help="search state budget")] = None,
    concrete: ConcreteOption = DEFAULT_CONFIG.concrete,
    max_kernel_ops: KernelOpsOption = DEFAULT_CONFIG.max_kernel_ops,
    max_block_ops: BlockOpsOption = DEFAULT_CONFIG.max_block_ops,
    max_grid_axes: GridAxesOption = DEFAULT_CONFIG.max_grid_axes,
    max_block_inputs: BlockInputsOption = DEFAULT_CONFIG.max_block_inputs,
    force: Annotated[bool, typer.Option(help="search even when the kernel cache, or sGraphs kept from other "
                                            "shapes, have an answer")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="neither read nor write the kernel cache, nor the "
                                                              "sGraphs kept for other shapes")] = False,
    db: DbOption = None,
    workers: Annotated[int | None, typer.Option(min=1, help="Ray workers (default: in-process)")] = None,
    ray_address: Annotated[str | None, typer.Option(help="join a running Ray cluster")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON report")] = False,
    svg: Annotated[Path | None, typer.Option("--svg", help="also write the winner's picture here")] = None,
    sgraph_out: SgraphOutOption = None,
) -> None:
    """Find, prove and time the fastest fused schedule of a program."""
    from superopt.api import optimize as run_optimize
    from superopt.jobspec import parse_request

    program = load_program(spec)
    _check_writable(svg, sgraph_out)  # before a search of minutes, not after it
    bounds = {"max_kernel_ops": max_kernel_ops, "max_block_ops": max_block_ops, "max_grid_axes": max_grid_axes,
              "max_block_inputs": max_block_inputs, "concrete": concrete}  # checked as a job request's are
    config = parse_request({"program": spec, "target": target, "budget_s": budget_s, "max_states": max_states,
                            "config": bounds}).search_config()
    with search_progress(err, budget_s) as progress:
        result = run_optimize(program, target=target, budget_s=budget_s, max_states=max_states, config=config,
                              force=force, cache=not no_cache, reuse=not no_cache, db=db, progress=progress,
                              workers=workers, ray_address=ray_address)
    if svg is not None:
        _write(svg, result.to_svg())
        err.print(f"wrote {svg}", markup=False)
    _write_sgraph(sgraph_out, result.best.sgraph)
    if as_json:
        emit_json(result.report())
        return
    _summary(result)


def _searched(depth: int) -> str:
    """How far a search the budget cut short got: the kernel counts it searched completely, so
    a user knows among which schedules the winner is the fastest."""
    if depth == 0:
        return "no kernel count was searched completely"
    counted = "1 kernel" if depth == 1 else f"up to {depth} kernels"
    return f"every schedule of {counted} was searched, deeper ones in part"


def _two_places(x: float) -> str:
    """Two decimals, or two significant digits below 0.1 (a small program's floor is not 0.00)."""
    return f"{x:.2f}" if x == 0 or abs(x) >= 0.1 else f"{x:.2g}"


def _summary(result: Any) -> None:
    best, rep = result.best, result.report()
    s = rep["search"]
    how = "from the kernel cache" if result.cache_hit else (
        "re-instantiated from an earlier search (shape reuse)" if s["reused"] else
        f"searched {'symbolically' if s['symbolic'] else 'concretely'}: {s['states']} states, "
        f"{s['pruned']} pruned, {s['verified']} verified in {s['seconds']:.1f} s"
        + (f" (budget exhausted: the best so far, found at {s['best_found_s']:.1f} s; {_searched(s['depth'])})"
           if s["budget_exhausted"] else "")
        + (f"; the winner checked at its real shapes in {s['final_check_s']:.1f} s" if s["final_check_s"] >= 0.1
           else ""))
    out.print(f"{result.program.name}: {how}", markup=False)
    out.print(render_sgraph(best.sgraph, best.params), markup=False)
    v = best.verdict
    proof = f"e-graph {v.egraph}" + (f" ({v.egraph_stats.get('rule_applications')} rule applications)" if v else "")
    out.print(f"verdict: {'PROVED' if v and v.proved else 'NOT PROVED'}: {proof}, finite fields "
              f"{v.finite_field_trials} trials (error bound {v.finite_field_error_bound:.1e}), float max rel err "
              f"{v.float_max_rel_err:.2e}", markup=False)
    table = Table("", "time (us)", "kernels", "DRAM (MB)", "x floor DRAM")
    floor_mb = result.floor_dram_bytes / 1e6
    for label, c in (("best", best), ("unfused baseline", result.baseline)):
        table.add_row(label, f"{_two_places(c.time_us)} ({c.time_source})", str(c.kernels),
                      _two_places(c.dram_bytes / 1e6), f"{c.dram_bytes / result.floor_dram_bytes:.2f}")
    table.add_row("physical floor", _two_places(result.floor_time_us), "", _two_places(floor_mb), "1.00")
    out.print(table)
    out.print(f"speedup over the unfused baseline: {result.speedup:.2f}x on {result.target}"
              f"{' (measured)' if result.measured else ' (estimated by the cost model)'}", markup=False)


@app.command()
@user_errors
def demo(
    budget_s: Annotated[float, typer.Option("--budget-s", help="search budget per program")] = 30.0,
    target: Annotated[str, _target_option("target to search and time for")] = DEFAULT_TARGET,
    db: DbOption = None,
) -> None:
    """The main job on the embedded defaults: optimize every built-in workload at its :ci and its
    published shape (local search, SQLite kernel cache, cost model without a GPU), then print the
    summary. A second run is served from the cache."""
    from superopt.batch import BatchEntry, run_batch, summary_rows
    from superopt.db.engine import open_database
    from superopt.jobs_render import batch_table
    from superopt.jobspec import JobRequest

    specs = [s for name in workloads.WORKLOADS for s in (f"{name}:ci", name)]
    entries = [
        BatchEntry(i, workloads.resolve(spec), JobRequest(program=spec, target=target, budget_s=budget_s))
        for i, spec in enumerate(specs, start=1)
    ]
    database = open_database(db)
    err.print(f"superopt demo: {len(entries)} programs, target {target}, cache {database}", markup=False)
    with count_progress(err, "demo", len(entries)) as update:
        def progress(views: list[Any]) -> None:
            done = [v for v in views if v.state.terminal]
            running = next((v.program_name for v in views if v.state.value == "running"), "")
            update(len(done), running and f"running {running}")

        views = run_batch(database, entries, local=True, on_progress=progress)
    rows = summary_rows(entries, views)
    out.print(batch_table(rows))
    hits = sum(1 for r in rows if r["cache_hit"])
    failed = [r for r in rows if r["state"] != "succeeded"]
    searched = len(rows) - hits - len(failed)
    out.print(f"{len(rows)} programs: {searched} searched, {hits} served from the kernel cache"
              + (f", {len(failed)} failed" if failed else "")
              + (" (run `make demo` again: everything is served from the cache)" if searched else ""),
              markup=False)
    if failed:
        raise typer.Exit(1)


# -- jobs, the kernel cache, the HTTP service and workers (DESIGN.md §8) ------------------------------

JsonOption = Annotated[bool, typer.Option("--json", help="machine-readable output")]
# One rule for a program hash wherever it is typed (superopt.db.keys.check_hash_prefix; HTTP too).
HashOption = Annotated[str | None, typer.Option(
    "--hash", help="canonical program hash or a prefix (4 to 64 lowercase hex digits)")]
# A stand-in for superopt.api.optimize (tests, experiments); hidden from --help.
OptimizerOption = Annotated[str | None, typer.Option(hidden=True, help="module:function to run instead of the search")]


@app.command()
@user_errors
def submit(
    spec: Annotated[str, typer.Argument(help="built-in workload or program JSON file")],
    target: Annotated[str, _target_option("target the worker searches and times for")] = DEFAULT_TARGET,
    budget_s: Annotated[float, typer.Option(help="search time budget in seconds")] = DEFAULT_BUDGET_S,
    max_states: Annotated[int | None, typer.Option(help="search state budget")] = None,
    force: Annotated[bool, typer.Option(help="search even when the cache has the answer")] = False,
    concrete: ConcreteOption = DEFAULT_CONFIG.concrete,
    max_kernel_ops: KernelOpsOption = DEFAULT_CONFIG.max_kernel_ops,
    max_block_ops: BlockOpsOption = DEFAULT_CONFIG.max_block_ops,
    max_grid_axes: GridAxesOption = DEFAULT_CONFIG.max_grid_axes,
    max_block_inputs: BlockInputsOption = DEFAULT_CONFIG.max_block_inputs,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Queue an optimization job for the workers (`superopt worker`); print its id and state."""
    from superopt.db.engine import open_database
    from superopt.db.jobs import JobQueue
    from superopt.jobspec import defined, parse_request

    program = load_program(spec)
    bounds = {"max_kernel_ops": max_kernel_ops, "max_block_ops": max_block_ops, "max_grid_axes": max_grid_axes,
              "max_block_inputs": max_block_inputs, "concrete": concrete}  # the request's `config`
    req = parse_request({"program": program.to_json(), "target": target, "budget_s": budget_s,
                         "max_states": max_states, "force": force, "config": bounds})
    job = req.submit_to(JobQueue(open_database(db)), defined(program))
    if as_json:
        emit_json(job.to_json())
    elif job.cache_hit:
        out.print(f"job {job.id} {job.state.value} from the cache (kernel {(job.result or {}).get('kernel_id')})")
    else:
        out.print(f"job {job.id} {job.state.value}")


@app.command()
@user_errors
def status(
    job_id: Annotated[int, typer.Argument(help="job id")], db: DbOption = None, as_json: JsonOption = False,
) -> None:
    """Show a job: state, progress, result or error."""
    from superopt.db.engine import open_database
    from superopt.db.jobs import JobQueue
    from superopt.jobs_render import job_table

    job = JobQueue(open_database(db, existing=True)).get(job_id)
    if as_json:
        emit_json(job.to_json())
    else:
        out.print(job_table(job))


@app.command()
@user_errors
def watch(
    job_id: Annotated[int, typer.Argument(help="job id")],
    interval: Annotated[float, typer.Option(min=0.05, help="seconds between updates")] = 0.5,
    db: DbOption = None,
) -> None:
    """Follow a job's progress live until it finishes (exit 1 unless it succeeded)."""
    import time

    from rich.live import Live

    from superopt.db.engine import open_database
    from superopt.db.jobs import JobQueue
    from superopt.jobs_render import job_table
    from superopt.worker import describe

    queue = JobQueue(open_database(db, existing=True))
    job = queue.get(job_id)
    if err.is_terminal:
        with Live(job_table(job), console=err, refresh_per_second=4, transient=True) as live:
            while not job.state.terminal:
                time.sleep(interval)
                job = queue.get(job_id)
                live.update(job_table(job))
    else:  # a log: a line now and then, as a piped search prints them
        gate = Throttle()
        while not job.state.terminal:
            if gate():
                running = f": {search_text(job.progress)}" if "states" in job.progress else ""
                err.print(printable(f"job {job.id} {job.state.value}{running}"), markup=False)
            time.sleep(interval)
            job = queue.get(job_id)
    out.print(job_table(job))
    out.print(describe(job), markup=False)
    if job.state.value != "succeeded":
        raise typer.Exit(1)


@app.command()
@user_errors
def cancel(job_id: Annotated[int, typer.Argument(help="job id")], db: DbOption = None) -> None:
    """Cancel a queued or running job."""
    from superopt.db.engine import open_database
    from superopt.db.jobs import JobQueue

    job = JobQueue(open_database(db, existing=True)).cancel(job_id)
    out.print(f"job {job.id} {job.state.value}")


cache_app = typer.Typer(cls=Commands, no_args_is_help=True,
                        help="The kernel cache: list, show, export, invalidate and verify winners.")
app.add_typer(cache_app, name="cache")


@cache_app.command("ls")
@user_errors
def cache_ls(
    program_hash: HashOption = None,
    target: Annotated[str | None, typer.Option(help="target name or fingerprint")] = None,
    program: Annotated[str | None, typer.Option(help="program name")] = None,
    limit: Annotated[int | None, typer.Option(min=1, max=MAX_ROWS,
                                              help="list at most this many [default: all]")] = None,
    offset: Annotated[int, typer.Option(min=0, max=MAX_ROWS, help="skip this many first")] = 0,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """List cached winners, newest first (the rows `GET /cache` pages through)."""
    from superopt.db.cache import KernelCache
    from superopt.db.engine import open_database
    from superopt.jobs_render import entries_table

    cache = KernelCache(open_database(db, existing=True))
    entries = cache.entries(program_hash, target, program=program, limit=limit, offset=offset)
    if as_json:
        emit_json([e.to_json() for e in entries])
    elif entries:
        out.print(entries_table(entries))
    else:
        filtered = program_hash or target or program or offset
        out.print("no cached winner matches" if filtered else "the cache holds no winner")


@cache_app.command("show")
@user_errors
def cache_show(
    kernel_id: Annotated[int, typer.Argument(help="kernel id (from `cache ls` or a job's result)")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show a stored kernel: sGraph, parameters, CUDA source, verdict, times."""
    from superopt.db.cache import KernelCache
    from superopt.db.engine import open_database
    from superopt.jobs_render import kernel_text

    kernel = KernelCache(open_database(db, existing=True)).kernel(kernel_id)
    if as_json:
        emit_json(kernel)
    else:
        out.print(kernel_text(kernel), markup=False)


@cache_app.command("export")
@user_errors
def cache_export(
    kernel_id: Annotated[int, typer.Argument(help="kernel id of a cached winner")],
    out_file: Annotated[Path | None, typer.Option("--out", "-o", help="write here instead of stdout")] = None,
    db: DbOption = None,
) -> None:
    """Write a cached winner's full result report (JSON, as `superopt optimize --json`)."""
    from superopt.db.cache import KernelCache
    from superopt.db.engine import open_database

    report = KernelCache(open_database(db, existing=True)).report(kernel_id)
    if out_file is None:
        emit_json(report)
    else:
        _write(out_file, json.dumps(report, indent=2) + "\n")
        err.print(f"wrote {out_file}", markup=False)


@cache_app.command("invalidate")
@user_errors
def cache_invalidate(
    kernel_id: Annotated[int | None, typer.Argument(help="kernel id of one winner")] = None,
    program_hash: HashOption = None,
    target: Annotated[str | None, typer.Option(help="target name or fingerprint")] = None,
    everything: Annotated[bool, typer.Option("--all", help="every winner")] = False,
    db: DbOption = None,
) -> None:
    """Forget cached winners (their candidates stay as history); the next job searches again."""
    from superopt.db.cache import KernelCache
    from superopt.db.engine import open_database

    if kernel_id is None and not (program_hash or target or everything):
        raise RequestError("invalidate", "name a kernel id, --hash, --target or --all")
    if everything and (kernel_id is not None or program_hash or target):
        raise RequestError("invalidate", "--all forgets every winner: name no kernel id, --hash or --target with it")
    cache = KernelCache(open_database(db, existing=True))
    n = cache.invalidate(program_hash=program_hash, target=target, kernel_id=kernel_id)
    if kernel_id is not None and n == 0:
        raise RequestError("invalidate", f"kernel {kernel_id} is not a cached winner"
                                         + (" of that hash and target" if program_hash or target else ""))
    out.print(f"invalidated {n} cached winner(s)")


@cache_app.command("verify")
@user_errors
def cache_verify(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Audit every stored row: its MAC, its kernel proved again, its CUDA generated again (exit 1 when any is bad)."""
    from superopt.db.audit import audit
    from superopt.db.engine import open_database
    from superopt.jobs_render import audit_table

    with closing(open_database(db, existing=True)) as database:
        report = audit(database)
    if as_json:
        emit_json(report.to_json())
    elif report.bad:
        out.print(audit_table(report.bad))
        out.print(f"{len(report.bad)} of {report.checked} rows are bad")
    else:
        out.print(f"{report.checked} rows checked: none is bad")
    if report.bad:
        raise typer.Exit(1)


@app.command()
@user_errors
def batch(
    file: Annotated[Path, typer.Argument(help="JSON-lines file: one program, built-in name or job request a line")],
    local: Annotated[bool, typer.Option(help="run the jobs in this process instead of through workers")] = False,
    workers: Annotated[int | None, typer.Option(min=1, help="run the jobs on Ray with this many workers")] = None,
    ray_address: Annotated[str | None, typer.Option(help="run the jobs on this Ray cluster")] = None,
    target: Annotated[str, _target_option("target of lines that name none")] = DEFAULT_TARGET,
    budget_s: Annotated[float, typer.Option(help="search budget of lines that name none")] = DEFAULT_BUDGET_S,
    db: DbOption = None,
    as_json: JsonOption = False,
    optimizer: OptimizerOption = None,
) -> None:
    """Optimize every program of a file (one job each) and print a summary; cached ones are not searched again."""
    from superopt.batch import read_batch, run_batch, summary_rows
    from superopt.db.engine import open_database
    from superopt.jobs_render import batch_table
    from superopt.worker import load_optimizer

    entries = read_batch(file, {"target": target, "budget_s": budget_s})
    database = open_database(db)
    optimize = load_optimizer(optimizer)
    if not (local or workers or ray_address):
        err.print(f"{len(entries)} jobs queued; workers run them (`superopt worker`, or use --local)", markup=False)
    with count_progress(err, "batch", len(entries)) as update:
        def progress(views: list[Any]) -> None:
            done = [v for v in views if v.state.terminal]
            update(len(done), f"{sum(1 for v in done if v.cache_hit)} from the cache")

        try:
            with _sigterm_as_interrupt():
                views = run_batch(database, entries, local=local, optimize=optimize, on_progress=progress,
                                  ray_workers=workers, ray_address=ray_address, optimizer_spec=optimizer)
        except KeyboardInterrupt:
            err.print("batch stopped" + (": its unfinished jobs are cancelled" if local else
                                         "; its jobs stay queued for the workers"), markup=False)
            raise typer.Exit(130) from None
    rows = summary_rows(entries, views)
    if as_json:
        emit_json(rows)
    else:
        out.print(batch_table(rows))
        hits = sum(1 for r in rows if r["cache_hit"])
        failed = sum(1 for r in rows if r["state"] != "succeeded")
        searched = len(rows) - hits - failed
        out.print(f"{len(rows)} jobs: {searched} searched, {hits} from the cache, {failed} not succeeded")
    if any(r["state"] != "succeeded" for r in rows):
        raise typer.Exit(1)


@app.command()
@user_errors
def report(
    results: Annotated[Path, typer.Argument(help="batch results: what `superopt batch FILE --json` prints")],
    html: Annotated[Path, typer.Option("--html", help="the HTML file to write (one page, charts inline)")],
) -> None:
    """Write a batch's results as an HTML page with charts: speedup, search time, kernels, verdicts."""
    from superopt.report import write_report

    n = write_report(results, html)
    out.print(f"wrote {html} ({n} jobs)", markup=False)


@app.command()
@user_errors
def serve(
    host: Annotated[str, typer.Option(help="address to listen on")] = SERVE_HOST,
    port: Annotated[int, typer.Option(min=1, max=65535)] = SERVE_PORT,
    max_body_bytes: Annotated[int, typer.Option(min=1024, help="largest request body accepted")] = MAX_BODY_BYTES,
    body_timeout_s: Annotated[float, typer.Option(
        min=0.1, help="seconds a request body may take to arrive")] = BODY_TIMEOUT_S,
    allowed_host: Annotated[list[str] | None, typer.Option(
        envvar=HOSTS_ENV, help="a Host name clients reach the service by, besides the loopback names and --host "
                               "(repeatable or comma-separated; '*': any)")] = None,
    token: Annotated[str | None, typer.Option(
        envvar=TOKEN_ENV, show_default=False,
        help=f"bearer token every route but the health checks requires; set ${TOKEN_ENV} rather than this "
             "option, which other users of the host can read in the process list")] = None,
    db: DbOption = None,
) -> None:
    """Serve jobs and the kernel cache over HTTP (with a token, clients must send it as a bearer token)."""
    import uvicorn

    from superopt.db.engine import open_database
    from superopt.db.integrity import signer_for_url
    from superopt.service import LOOPBACK_HOSTS, HiddenTokens, create_app

    database = open_database(db)
    signer_for_url(database.url)  # a key that cannot be trusted stops the service here, not at each request
    _check_listen(host, port)
    if not token and host not in ("127.0.0.1", "localhost", "::1"):
        err.print(f"warning: serving on {host} without {TOKEN_ENV}: anyone who reaches it can submit jobs")
    named = [h.strip() for value in allowed_host or [] for h in value.split(",") if h.strip()]
    listening = [] if host in ("0.0.0.0", "::") else [host]  # a wildcard address is no name clients use
    hosts = [*LOOPBACK_HOSTS, *listening, *named]
    service = create_app(database, token=token or None, max_body_bytes=max_body_bytes, allowed_hosts=hosts,
                      body_timeout_s=body_timeout_s)
    logging.getLogger("uvicorn.access").addFilter(HiddenTokens())
    uvicorn.run(service, host=host, port=port)


def _check_listen(host: str, port: int) -> None:
    """Refuse an address `serve` cannot listen on (a port in use, a host that is none of this
    machine's) in one line, before uvicorn logs its own failure and exits 3."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind(address)
    except OSError as e:
        raise RequestError("serve", f"cannot listen on {host}:{port}: {e.strerror or e}") from None


@app.command()
@user_errors
def worker(
    db: DbOption = None,
    once: Annotated[bool, typer.Option(help="exit when the queue is empty instead of waiting for jobs")] = False,
    ray_address: Annotated[str | None, typer.Option(help="Ray cluster to search on (passed to the optimizer)")] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="Ray workers for each job's search")] = None,
    lease_s: Annotated[float, typer.Option(min=1.0, max=MAX_LEASE_S, help="seconds a job stays ours without a "
                                                                       "heartbeat")] = LEASE_S,
    poll_s: Annotated[float, typer.Option(min=0.01, help="seconds between looks at an empty queue")] = POLL_S,
    db_retry_s: Annotated[float, typer.Option(min=0.0, help="seconds to keep retrying an unreachable database "
                                                            "before exiting")] = DB_RETRY_S,
    optimizer: OptimizerOption = None,
) -> None:
    """Claim and run jobs from the queue; SIGTERM or Ctrl-C hands the current job back."""
    from superopt.db.engine import open_database
    from superopt.worker import Worker, load_optimizer

    w = Worker(
        open_database(db), optimize=load_optimizer(optimizer), lease_s=lease_s, poll_s=poll_s,
        ray_address=ray_address, workers=workers, db_retry_s=db_retry_s, log=lambda line: out.print(line, markup=False),
    )
    err.print(f"worker {w.id} ({w.queue.db})", markup=False)
    try:
        with _sigterm_as_interrupt():
            done = w.run(once=once)
    except KeyboardInterrupt:
        err.print(f"worker {w.id} stopped", markup=False)
        return
    err.print(f"worker {w.id}: {done} job(s), queue empty", markup=False)


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a service manager stopping the process) handled as Ctrl-C is: the job running here
    is handed back, not left running under a dead worker until its lease expires."""
    import signal

    def stop(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)



@app.command()
@user_errors
def export(
    spec: Annotated[str, typer.Argument(help="built-in workload or program JSON file")],
    cuda: Annotated[Path, typer.Option("--cuda", help="write the CUDA source (one compilable .cu file) here")],
    sgraph: Annotated[
        str | None, typer.Option(help="export this schedule instead of optimizing: sGraph JSON file, 'reference' "
                                      "or 'baseline'")
    ] = None,
    params: Annotated[str, typer.Option(help="symbol values for --sgraph, e.g. gx=8,F=4 (default: the cost "
                                             "model's best)")] = "",
    target: Annotated[str, _target_option("target the kernels are generated for")] = DEFAULT_TARGET,
    budget_s: Annotated[float | None, typer.Option(
        "--budget-s", help=f"search time budget, as `optimize` takes [default: {DEFAULT_BUDGET_S:g}]")] = None,
    force: Annotated[bool, typer.Option(help="search even when the kernel cache has an answer, as `optimize "
                                            "--force`")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="neither read nor write the kernel cache, as "
                                                              "`optimize --no-cache`")] = False,
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Write a program's best kernel(s) as one CUDA file, with launch parameters in its header."""
    from superopt.codegen import CodegenError, describe_steps, generate
    from superopt.costmodel import estimate

    program = load_program(spec)
    tgt = resolve_target(target).target
    if sgraph is not None and (budget_s is not None or force or no_cache):
        raise LoadError("--budget-s, --force and --no-cache go with a search; --sgraph exports the schedule given")
    if sgraph is None:
        if params:
            raise LoadError("--params needs --sgraph (without it, the optimizer chooses the schedule)")
        from superopt.api import optimize
        from superopt.jobspec import parse_request

        budget = DEFAULT_BUDGET_S if budget_s is None else budget_s
        parse_request({"program": spec, "target": target, "budget_s": budget})  # checked as `optimize` checks it
        with search_progress(err, budget) as progress:
            best = optimize(program, target=target, budget_s=budget, force=force, cache=not no_cache,
                            reuse=not no_cache, db=db, progress=progress).best
        sg, values = best.sgraph, dict(best.params)
    else:
        sg = load_sgraph(sgraph, program, spec)
        check_matches(sg, program)
        values = parse_params(params) if params else _best_params(sg, tgt)
    inst = instantiate(sg, values, tgt)
    if sgraph is not None:  # the optimizer returns proved schedules only; so does export
        from superopt.verifier.verify import verify as run_verify

        verdict = run_verify(program, sg, target=tgt, params=values)
        if not verdict.proved:
            err.print(f"error: {sg.name} is not proved equal to {program.name} (e-graph {verdict.egraph}, float max "
                      f"rel err {verdict.float_max_rel_err:.2e}); nothing written", markup=False)
            raise typer.Exit(1)
    try:
        prog = generate(inst)
    except CodegenError as e:
        raise LoadError(f"cannot generate CUDA for {sg.name}: {e}") from None
    _write(cuda, prog.source)
    if as_json:
        emit_json({
            "program": program.name, "hash": program.canonical_hash(), "sgraph": sg.name, "params": values,
            "target": tgt.name, "file": str(cuda), "source_sha256": prog.source_hash,
            "estimated_us": estimate(inst).time_us, "kernels": prog.launch_json(),
        })
        return
    out.print(f"wrote {cuda}: {sg.name} {inst.params_text() or '(no params)'} for {tgt.name}", markup=False)
    for line in describe_steps(prog):
        out.print(f"  {line}", markup=False)

def _write_sgraph(path: Path | None, sg: SGraph) -> None:
    """Write an sGraph as the JSON file `verify`, `run --sgraph` and `export --sgraph` read (no
    path: nothing), so a schedule can be handed from one command to the next."""
    if path is not None:
        _write(path, sg.dumps() + "\n")
        err.print(f"wrote {path}", markup=False)


def _best_params(sg: SGraph, tgt: Target) -> dict[str, int]:
    """The cost model's best parameters of `sg` on `tgt`: what `run` and `export` take when
    none are given."""
    from superopt.costmodel import best_params

    try:
        return best_params(sg, tgt)
    except ValueError as e:
        raise InstantiationError(str(e)) from None


def _write(path: Path, text: str) -> None:
    """Write a file the user named; a path that cannot be written is a user error."""
    try:
        path.write_text(text)
    except OSError as e:
        raise LoadError(f"cannot write {path}: {e.strerror or e}") from None


def _check_writable(*paths: Path | None) -> None:
    """Refuse at once an output path that `_write` would refuse for being a directory or in a
    directory that is not there."""
    for path in paths:
        if path is not None and (path.is_dir() or not path.parent.is_dir()):
            why = "a directory" if path.is_dir() else f"no directory {path.parent}"
            raise LoadError(f"cannot write {path}: {why}")


def _tolerance(program: Program) -> float:
    from superopt.dtypes import dtype

    return dtype(program.dtype).tolerance


def _one_line_warnings() -> None:
    """Print superopt's own warnings (a cache row refused: `CacheIntegrityWarning`) as one
    `warning:` line on stderr, as errors are printed, not Python's file, line and source text."""
    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, CacheIntegrityWarning):
            print(f"warning: {message}", file=sys.stderr)
        else:
            shown(message, category, *args, **kwargs)

    warnings.showwarning = show


def main() -> None:
    _one_line_warnings()
    app()


if __name__ == "__main__":
    main()
