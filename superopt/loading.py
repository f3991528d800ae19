"""Loading what users name on the command line or send to the service: programs and sGraphs.

A program is a built-in workload spec (`gqa`, `gqa:ci`), a path to a program JSON file, or a path
to an ONNX model (`*.onnx`, imported with the `onnx` extra). An sGraph is a path to an sGraph JSON
file, or `reference` / `baseline` for a built-in workload.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from superopt import workloads
from superopt.build import unfused_baseline
from superopt.jsontext import JSONTextError, parse_json
from superopt.program import Program, ProgramError
from superopt.sgraph import SGraph, SGraphError


class LoadError(ValueError):
    """A name or file that does not hold what was asked for."""


def read_json(path: str | Path) -> Any:
    p = Path(path)
    if p.is_dir():
        raise LoadError(f"{p}: a directory, not a file")
    if not p.is_file():
        raise LoadError(f"{p}: not a regular file" if p.exists() else f"no such file: {p}")
    try:
        return parse_json(p.read_bytes())
    except JSONTextError as e:
        raise LoadError(f"{p}: {e}") from None


def load_program(spec: str) -> Program:
    if workloads.is_builtin(spec):
        try:
            return workloads.resolve(spec)
        except KeyError as e:
            raise LoadError(str(e.args[0])) from None
    if not Path(spec).exists():
        raise LoadError(
            f"{spec!r} is neither a built-in workload ({', '.join(workloads.WORKLOADS)}) nor a program file"
        )
    if spec.endswith(".onnx"):
        return load_onnx(spec)
    data = read_json(spec)
    try:
        return Program.from_json(data)
    except ProgramError as e:
        raise ProgramError(f"{spec}: {e}") from None


def load_onnx(path: str, name: str | None = None) -> Program:
    """The program of an ONNX model file (its float initializers become inputs)."""
    if not Path(path).is_file():
        raise LoadError(f"no such file: {path}")
    try:
        from superopt.frontends.onnx_import import import_onnx
    except ImportError as e:
        raise LoadError(f"reading {path} needs the onnx package ({e}): pip install 'superopt[onnx]'") from None
    return import_onnx(path, name)


def load_sgraph(spec: str, program: Program, program_spec: str) -> SGraph:
    if spec == "baseline":
        return unfused_baseline(program)
    if spec == "reference":
        if not workloads.is_builtin(program_spec):
            raise LoadError(f"the 'reference' sGraph is the hand-written one of a built-in workload; {program_spec!r} "
                            "is a program file (give an sGraph JSON file, or 'baseline')")
        return workloads.split_name(program_spec)[0].reference(program)
    data = read_json(spec)
    try:
        return SGraph.from_json(report_sgraph(data) if is_report(data) else data)
    except SGraphError as e:
        raise SGraphError(f"{spec}: {e}") from None


def is_report(data: Any) -> bool:
    """Whether a JSON document is a result report (`optimize --json`, `cache export`): what a user
    holds after a search, so commands that read an sGraph take one and use its winner."""
    return isinstance(data, dict) and "schema" not in data and isinstance(data.get("best"), dict) \
        and isinstance(data.get("program"), dict)


def report_sgraph(data: dict[str, Any]) -> Any:
    """The winner's sGraph document inside a report."""
    sgraph = data["best"].get("sgraph")
    if not isinstance(sgraph, dict):
        raise LoadError("a result report without a best sGraph ('best.sgraph')")
    return sgraph


def kind_of(data: Any) -> str:
    """'program' or 'sgraph', from a JSON document's schema field."""
    schema = data.get("schema", "") if isinstance(data, dict) else ""
    if schema.startswith("superopt.program/"):
        return "program"
    if schema.startswith("superopt.sgraph/"):
        return "sgraph"
    raise LoadError(f"unknown schema {schema!r}: expected a superopt program or sGraph document")
