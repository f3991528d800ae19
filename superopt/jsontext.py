"""JSON text that users hand over (files, batch lines, request bodies), parsed into one clear
message when it cannot be: besides malformed text, the decoder fails on bytes that are not UTF-8,
on nesting deeper than Python's recursion limit and on integers of more than 4,300 digits, each
with an exception of its own. A key given twice in one object is refused too: Python's decoder
keeps the last, so a program with two "shape" fields would silently be one of them."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Self


class JSONTextError(ValueError):
    """JSON text that does not parse; the message says why."""


def json_problem(e: BaseException) -> str | None:
    """What is wrong with text whose parse raised `e`; None when `e` is not a parse failure."""
    if isinstance(e, json.JSONDecodeError):
        return f"not valid JSON: {e}"
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text ({e.reason} at byte {e.start})"
    if isinstance(e, RecursionError):
        return "not valid JSON: nested too deeply"
    if isinstance(e, ValueError):  # an integer literal too long to convert
        return f"not valid JSON: {e}"
    return None


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} is given twice in one object")
        out[key] = value
    return out


def loads(text: str | bytes) -> Any:
    """`json.loads`, refusing a key given twice in one object (ValueError, as its other failures)."""
    return json.loads(text, object_pairs_hook=_unique)


def parse_json(text: str | bytes) -> Any:
    """The document in `text`; bytes must be UTF-8 (json.loads would guess UTF-16 or UTF-32
    from their first bytes), a byte-order mark aside."""
    try:
        return loads(text.decode("utf-8-sig") if isinstance(text, bytes) else text)
    except (ValueError, RecursionError) as e:
        raise JSONTextError(json_problem(e)) from None


class JSONDocument(ABC):
    """A type users hand over as JSON text (programs, sGraphs): its text read and written in one
    way, a parse failure raised as the type's own error so its layer reports it like any other."""

    text_error: ClassVar[type[ValueError]]

    @abstractmethod
    def to_json(self) -> dict[str, Any]: ...

    @classmethod
    @abstractmethod
    def from_json(cls, data: Any) -> Self: ...

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    @classmethod
    def loads(cls, text: str) -> Self:
        try:
            data = parse_json(text)
        except JSONTextError as e:
            raise cls.text_error(str(e)) from None
        return cls.from_json(data)
