"""What a job request holds, validated the same way for the HTTP service and for batch files.

A request names a program (a built-in workload name, or program JSON inline) and options: target,
budgets, `force`, search bounds. Every problem is a RequestError naming the field it is in
("budget_s", "config.max_kernel_ops", "program"), so that front ends can answer with one line.
The service never reads files: only batch files, written by the user at the command line, may
name a program JSON file, relative to the batch file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from superopt import workloads
from superopt.api import NoCandidate, check_defined
from superopt.config import DEFAULT_BUDGET_S, DEFAULT_TARGET, TARGET_HELP, SearchConfig, bound
from superopt.db.errors import RequestError
from superopt.db.jobs import JobQueue, JobView
from superopt.limits import MAX_BUDGET_S, MAX_STATES, shown
from superopt.loading import LoadError, load_program
from superopt.program import Program, ProgramError
from superopt.targets import TARGETS

_STRICT = ConfigDict(extra="forbid", strict=True)


def _bound(name: str) -> Any:
    """The schema field of a search bound: default, range and description from SearchConfig."""
    f = bound(name)
    return Field(f.default, **f.metadata)


class ConfigSpec(BaseModel):
    """The search bounds (superopt.config.SearchConfig); omitted fields keep their defaults."""

    model_config = _STRICT
    max_kernel_ops: int = _bound("max_kernel_ops")
    max_block_ops: int = _bound("max_block_ops")
    max_grid_axes: int = _bound("max_grid_axes")
    max_block_inputs: int = _bound("max_block_inputs")
    concrete: bool = _bound("concrete")

    def to_config(self) -> SearchConfig:
        return SearchConfig(**self.model_dump())


class JobRequest(BaseModel):
    """The body of `POST /jobs`, and one line of a batch file."""

    model_config = _STRICT
    program: Any = Field(description="program JSON (superopt.program/1) or a built-in workload name")
    target: str = Field(DEFAULT_TARGET, description=TARGET_HELP)
    budget_s: float | None = Field(DEFAULT_BUDGET_S, gt=0, le=MAX_BUDGET_S, allow_inf_nan=False,
                                   description="search time budget in seconds (null: none)")
    max_states: int | None = Field(None, gt=0, le=MAX_STATES, description="search state budget")
    force: bool = Field(False, description="search even when the cache has the answer")
    config: ConfigSpec | None = None

    @field_validator("program")
    @classmethod
    def _program_kind(cls, v: Any) -> Any:
        if not isinstance(v, dict | str):
            raise ValueError(f"expected program JSON (an object) or a built-in workload name, got {type(v).__name__}")
        return v

    @field_validator("target")
    @classmethod
    def _known_target(cls, v: str) -> str:
        if v != "auto" and v.lower() not in TARGETS:
            raise ValueError(f"unknown target {shown(v)}; expected auto or one of {', '.join(TARGETS)}")
        return v.lower()

    def search_config(self) -> SearchConfig:
        return self.config.to_config() if self.config else SearchConfig()

    def submit_to(self, queue: JobQueue, program: Program, idempotency_key: str | None = None) -> JobView:
        return queue.submit(
            program, target=self.target, config=self.search_config(), budget_s=self.budget_s,
            max_states=self.max_states, force=self.force, idempotency_key=idempotency_key,
        )

    def build_program(self, files_under: Path | None = None) -> Program:
        """The program this request names; a RequestError("program", ...) when it names none.

        A string is a built-in workload name, or (only when `files_under` is given) a program
        JSON file relative to that directory. A program `superopt check` refuses (not finite in
        its dtype: `api.check_defined`) is refused here too, before it is queued."""
        try:
            if isinstance(self.program, dict):
                program = Program.from_json(self.program)
            elif files_under is None or workloads.is_builtin(self.program):
                program = _builtin(self.program)
            elif not (files_under / self.program).is_file():
                raise LoadError(f"{self.program!r} is neither a built-in workload ({', '.join(workloads.WORKLOADS)}) "
                                f"nor a program file in {files_under}")
            else:
                program = load_program(str(files_under / self.program))
        except (ProgramError, LoadError) as e:
            raise RequestError("program", str(e)) from None
        return defined(program)


def defined(program: Program) -> Program:
    """`program`, or RequestError("program", ...) where `superopt check` refuses it (not finite in
    its dtype: `api.check_defined`): refused before it is queued, not by the worker."""
    try:
        check_defined(program)
    except NoCandidate as e:
        raise RequestError("program", str(e)) from None
    return program


def _builtin(name: str) -> Program:
    if not workloads.is_builtin(name):
        raise LoadError(f"{shown(name)} is not a built-in workload ({', '.join(workloads.WORKLOADS)})")
    try:
        return workloads.resolve(name)
    except KeyError as e:
        raise LoadError(str(e.args[0])) from None


def parse_request(data: Any) -> JobRequest:
    """A JobRequest from parsed JSON, or the RequestError of its first problem."""
    if not isinstance(data, dict):
        raise RequestError("body", f"expected a JSON object, got {type(data).__name__}")
    try:
        return JobRequest.model_validate(data)
    except ValidationError as e:
        raise request_error(e.errors()) from None


def request_error(errors: Sequence[Any]) -> RequestError:
    """The first of Pydantic's (or FastAPI's) validation errors, as a RequestError naming its field."""
    err = errors[0]
    if err["type"] == "json_invalid":
        return RequestError("body", f"not valid JSON ({err.get('ctx', {}).get('error', err['msg'])})")
    loc = tuple(err["loc"])
    if loc[:1] in (("body",), ("path",), ("query",), ("header",)):
        loc = loc[1:]
    field = ".".join(str(p) for p in loc) or "body"
    if err["type"] == "extra_forbidden":
        return RequestError(field, "unknown field")
    if err["type"] == "missing":
        return RequestError(field, "required field missing")
    return RequestError(field, str(err["msg"]).removeprefix("Value error, "))
