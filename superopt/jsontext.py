"""JSON text that users hand over (files, batch lines, request bodies), parsed into one clear
message when it cannot be: besides malformed text, the decoder fails on bytes that are not UTF-8,
on nesting deeper than Python's recursion limit and on integers of more than 4,300 digits, each
with an exception of its own."""

from __future__ import annotations

import json
from typing import Any


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


def parse_json(text: str | bytes) -> Any:
    """The document in `text`; bytes must be UTF-8 (json.loads would guess UTF-16 or UTF-32
    from their first bytes), a byte-order mark aside."""
    try:
        return json.loads(text.decode("utf-8-sig") if isinstance(text, bytes) else text)
    except (ValueError, RecursionError) as e:
        raise JSONTextError(json_problem(e)) from None
