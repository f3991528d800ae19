"""The structure of sGraph JSON (superopt.sgraph/1): which fields an object holds and of what type.

A file with a misspelt field (`typo_dtpye` beside `dtype`) must be refused, as a program with one
is, not read as if the field were left out; pydantic checks the structure, unknown fields forbidden,
and `structure_error` names the first problem by its place (`kernels[0].body[1].op`). What the
fields mean together (shapes, dims, which tensor a kernel may read) is `superopt.sgraph.analyze`'s
to check, on the dataclasses built from these models.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, ValidationError

from superopt.limits import MAX_NAME_LENGTH, NAME_PATTERN, NAME_RULE, name_problem, shown

KERNEL_KINDS = ("library", "graph")
# An sGraph's own name is its program's and what made it (`.searched`, `.unfused`, `.part`).
SGRAPH_NAME_LENGTH = MAX_NAME_LENGTH + 16
CANONICAL_NAME = re.compile(r"\$[0-9]{1,9}")


def _size(v: object) -> int | str:
    if isinstance(v, bool) or not isinstance(v, int | str):
        raise ValueError("input should be a size (an integer or a symbol expression)")
    return v


def _name(v: str) -> str:
    """Tensor, kernel, block tensor and axis names keep to the program names' grammar: they reach
    terminals, database rows and comments in generated code, as program names do. A stored kernel
    names the program's tensors by their canonical places (`$0`: `superopt.db.canonical_names`)."""
    if not CANONICAL_NAME.fullmatch(v) and (problem := name_problem(v)) is not None:
        raise ValueError(f"not a valid name: {problem}")
    return v


def sgraph_name_problem(name: str) -> str | None:
    """Why `name` is not a valid sGraph name (None when it is): a program name and a suffix."""
    if len(name) > SGRAPH_NAME_LENGTH or not NAME_PATTERN.fullmatch(name):
        return f"{NAME_RULE}, with a suffix of its own: at most {SGRAPH_NAME_LENGTH} characters in all"
    return None


def _sgraph_name(v: str) -> str:
    if (problem := sgraph_name_problem(v)) is not None:
        raise ValueError(f"not a valid sGraph name: {problem}")
    return v


Text = Annotated[str, Field(min_length=1)]
Name = Annotated[str, AfterValidator(_name)]
SizeJSON = Annotated[int | str, PlainValidator(_size)]


class _Strict(BaseModel):
    """No unknown fields, no coercion (`"4"` is not 4, `true` is not 1)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class TensorJSON(_Strict):
    id: Name
    shape: list[int]
    dtype: Text


class AxisJSON(_Strict):
    name: Name
    size: SizeJSON


class BlockInputJSON(_Strict):
    id: Name
    tensor: Name
    imap: list[int | None]
    fmap: int | None = None


class BlockOpJSON(_Strict):
    id: Name
    op: Text
    inputs: list[Name]
    attrs: dict[str, Any] = {}


class AccumulatorJSON(_Strict):
    id: Name
    source: Name
    kind: Text
    dim: int | None = None


class BlockOutputJSON(_Strict):
    source: Name
    tensor: Name
    omap: list[int]


class LibraryKernelJSON(_Strict):
    kind: Literal["library"]
    id: Name
    op: Text
    inputs: list[Name]
    attrs: dict[str, Any] = {}
    output: Name


class GraphKernelJSON(_Strict):
    kind: Literal["graph"]
    id: Name
    grid: list[AxisJSON]
    loop: AxisJSON
    inputs: list[BlockInputJSON]
    body: list[BlockOpJSON] = []
    accumulators: list[AccumulatorJSON]
    post: list[BlockOpJSON] = []
    outputs: list[BlockOutputJSON]


class SGraphJSON(_Strict):
    schema_id: str = Field(alias="schema")  # its value is read first, to tell a version from a mistake
    name: Annotated[str, AfterValidator(_sgraph_name)] = "sgraph"
    inputs: list[TensorJSON]
    kernels: list[Annotated[LibraryKernelJSON | GraphKernelJSON, Field(discriminator="kind")]]
    outputs: list[Name]


def structure_error(e: ValidationError) -> str:
    """The first problem pydantic found, as one line that names its place."""
    err = e.errors()[0]
    path = _path(err["loc"])
    if err["type"] in ("extra_forbidden", "missing"):
        what = "unexpected" if err["type"] == "extra_forbidden" else "missing"
        return f"{_place(path[:-1])}: {what} field {path[-1]!r}"
    if err["type"] == "union_tag_not_found":  # the kernel kind, the only tag
        return f"{_place(path)}: missing field 'kind'"
    if err["type"] == "union_tag_invalid":
        expected = " or ".join(map(repr, KERNEL_KINDS))
        return f"{_place(path)}: unknown kernel kind {err['input']['kind']!r} (expected {expected})"
    if err["type"] in ("model_type", "model_attributes_type", "dict_type"):  # pydantic's words name the model
        return f"{_place(path)}: input should be an object, got {err['input']!r}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{_place(path)}: {msg[:1].lower()}{msg[1:]}, got {shown(err['input'])}"


def _path(loc: Sequence[int | str]) -> list[int | str]:
    """The place of an error without the tags pydantic adds after a kernel's index."""
    return [p for i, p in enumerate(loc) if not (i and isinstance(loc[i - 1], int) and p in KERNEL_KINDS)]


def _place(path: Sequence[int | str]) -> str:
    """`kernels[0].body[1]`; `sGraph` for the document itself."""
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).removeprefix(".")
    return text or "sGraph"
