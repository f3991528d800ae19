"""What of a user's text reaches generated source: nothing but comment text, escaped.

Tensor, tile, axis and kernel ids come from programs and sGraphs, which strangers write: a
program's names follow `superopt.limits`' grammar, but an sGraph read from a file or a database
row (which is not trusted) may hold any text. So every C identifier is made here from positions
and digests, never from an id, and an id appears only inside comments, passed through
`comment_text`: it then can neither end its comment (`*/`, a line break), nor splice the next
line into it (a backslash at the end of a `//` line), nor form a trigraph.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

# Printable ASCII but the backslash: every other character is spelt <U+XXXX>.
_UNSAFE = re.compile(r"[^\x20-\x5b\x5d-\x7e]")
# `/*` and `*/` open and close block comments; `??` starts a trigraph (`??/` is a backslash).
_DELIMITER = re.compile(r"(?<=\*)(?=/)|(?<=/)(?=\*)|(?<=\?)(?=\?)")


def c_names(names: Iterable[str], prefix: str) -> dict[str, str]:
    """C identifiers for ids: `prefix` and the id's position among the distinct ids."""
    out: dict[str, str] = {}
    for n in names:
        out.setdefault(n, f"{prefix}{len(out)}")
    return out


def kernel_name(sgraph_name: str, position: int) -> str:
    """The `__global__` function of the graph kernel at `position` in the sGraph: distinct across
    sGraphs of different names (files exported from several programs link together), made of a
    digest of the name, never of its text."""
    return f"so_{hashlib.sha256(sgraph_name.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}_k{position}"


def comment_text(text: str) -> str:
    """`text` as it may stand inside a `//` or `/* */` comment: one line of printable ASCII with
    no backslash and no comment or trigraph delimiter (a space goes between their characters)."""
    escaped = _UNSAFE.sub(lambda m: f"<U+{ord(m.group()):04X}>", text)
    return _DELIMITER.sub(" ", escaped)
