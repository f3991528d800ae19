"""The `superopt` command line (Typer). Errors a user can cause print one line and exit 2."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from superopt import workloads
from superopt.instantiate import InstantiationError, instantiate, parse_params
from superopt.loading import LoadError, kind_of, load_program, load_sgraph, read_json
from superopt.ops import OpError
from superopt.program import Program, ProgramError
from superopt.render import render_program, render_sgraph
from superopt.sgraph import SGraphError, check_matches
from superopt.sizes import SizeError
from superopt.targets import target as get_target

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
# Piped output keeps whole table rows readable instead of Rich's 80-column default.
_WIDTH = None if sys.stdout.isatty() else 160
out = Console(highlight=False, soft_wrap=True, width=_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_WIDTH)

USER_ERRORS: tuple[type[Exception], ...] = (
    ProgramError, SGraphError, InstantiationError, LoadError, OpError, SizeError,
)
F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Turn an error the user caused into one message and exit code 2 (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as e:
            err.print(f"error: {e}", markup=False)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


@app.command()
@user_errors
def programs(as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False) -> None:
    """List the built-in workloads and their shapes."""
    rows = []
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
    spec: Annotated[str, typer.Argument(help="built-in workload, program JSON file or sGraph JSON file")],
    reference: Annotated[bool, typer.Option(help="show the workload's hand-written fused sGraph")] = False,
    baseline: Annotated[bool, typer.Option(help="show the program's unfused baseline sGraph")] = False,
    params: Annotated[str, typer.Option(help="symbol values to print with an sGraph, e.g. gx=8,F=4")] = "",
) -> None:
    """Print a program or an sGraph."""
    values = parse_params(params) if params else None
    if Path(spec).is_file() and kind_of(read_json(spec)) == "sgraph":
        out.print(render_sgraph(load_sgraph(spec, Program(), spec), values), markup=False)
        return
    program = load_program(spec)
    if reference or baseline:
        sg = load_sgraph("reference" if reference else "baseline", program, spec)
        out.print(render_sgraph(sg, values), markup=False)
        return
    out.print(render_program(program), markup=False)


@app.command()
@user_errors
def check(file: Annotated[str, typer.Argument(help="program JSON file")]) -> None:
    """Validate a program JSON file and print its canonical hash."""
    program = Program.from_json(read_json(file))
    out.print(f"{program.canonical_hash()}  {program.name}", markup=False)


@app.command()
@user_errors
def run(
    spec: Annotated[str, typer.Argument(help="built-in workload or program JSON file")],
    sgraph: Annotated[str, typer.Option(help="sGraph JSON file, or 'reference' / 'baseline'")] = "reference",
    params: Annotated[str, typer.Option(help="symbol values, e.g. gx=8,F=4")] = "",
    target: Annotated[str, typer.Option(help="target whose limits the parameters must meet")] = "h100",
    seed: Annotated[int, typer.Option(help="seed of the random inputs")] = 0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Run an sGraph in the interpreter; print its max relative error against the float64 reference."""
    from superopt.interpreter import run_float
    from superopt.reference import evaluate, max_rel_err, random_inputs

    program = load_program(spec)
    sg = load_sgraph(sgraph, program, spec)
    check_matches(sg, program)
    inst = instantiate(sg, parse_params(params), get_target(target))
    inputs = random_inputs(program, seed)
    refs = evaluate(program, inputs)
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
def demo() -> None:
    """The main job on the embedded defaults (interim: validate the built-in workloads and run
    their reference sGraphs in the interpreter at the :ci shapes)."""
    from superopt.assignments import enumerate_assignments
    from superopt.interpreter import run_float
    from superopt.reference import evaluate, max_rel_err, random_inputs

    h100 = get_target("h100")
    table = Table("workload", "hash", "reference kernels", "valid params (published)", "max rel err (:ci)")
    for name in workloads.WORKLOADS:
        program, ref = workloads.reference_for(name)
        n_valid = sum(1 for _ in enumerate_assignments(ref, h100))
        ci_prog, ci_ref = workloads.reference_for(f"{name}:ci")
        inputs = random_inputs(ci_prog, 0)
        want = evaluate(ci_prog, inputs)[0]
        worst = max(
            max_rel_err(run_float(instantiate(ci_ref, v, h100), inputs)[0], want)
            for v in enumerate_assignments(ci_ref, h100, limit=4)
        )
        table.add_row(name, program.canonical_hash()[:12], str(len(ref.kernels)), str(n_valid), f"{worst:.2e}")
    out.print(table)


def _tolerance(program: Program) -> float:
    from superopt.dtypes import dtype

    return dtype(program.dtype).tolerance


def main() -> None:
    app()


if __name__ == "__main__":
    main()
