"""What of a user's text reaches generated source: letters, digits and `_` in parameter names, and
comment text, escaped.

Tensor, tile, axis and kernel ids come from programs and sGraphs, which strangers write: a
program's names follow `superopt.limits`' grammar, but an sGraph read from a file or a database
row (which is not trusted) may hold any text. So a kernel parameter is named after its tensor only
through `param_names`, which keeps nothing but A-Z a-z 0-9 and `_` of it behind a prefix no
reserved or generator-made identifier has; every other C identifier is made from positions and
digests. Ids in full appear only inside comments, passed through `comment_text`: they then can
neither end their comment (`*/`, a line break), nor splice the next line into it (a backslash at
the end of a `//` line), nor form a trigraph.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterable

from superopt.limits import MAX_NAME_LENGTH

# Printable ASCII but the backslash: every other character is spelt <U+XXXX>.
_UNSAFE = re.compile(r"[^\x20-\x5b\x5d-\x7e]")
# `/*` and `*/` open and close block comments; `??` starts a trigraph (`??/` is a backslash).
_DELIMITER = re.compile(r"(?<=\*)(?=/)|(?<=/)(?=\*)|(?<=\?)(?=\?)")
# Runs of characters but letters and digits, underscores among them: C++ reserves every `__`.
_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9]+")
# Parameter prefixes: inputs, outputs. No keyword, built-in (threadIdx, warpSize) or identifier the
# generator declares (tid, so_*, t_N, v_N, blk_x, ...) starts with either.
INPUT_PREFIX, OUTPUT_PREFIX = "p_", "o_"


def c_names(names: Iterable[str], prefix: str) -> dict[str, str]:
    """C identifiers for ids: `prefix` and the id's position among the distinct ids."""
    out: dict[str, str] = {}
    for n in names:
        out.setdefault(n, f"{prefix}{len(out)}")
    return out


def param_names(tensors: Iterable[str], outputs: Collection[str]) -> dict[str, str]:
    """C identifiers for a kernel's tensor parameters, named after the tensors so the source reads
    like the program: the prefix (`o_` for `outputs`, else `p_`), then the name with each run of
    characters outside A-Z a-z 0-9 as one `_` (none leading or trailing; cut to the name limit, for
    sGraph ids follow no grammar), then `_1`, `_2`, ... where that is taken (`a.b` and `a_b`)."""
    out: dict[str, str] = {}
    for n in tensors:
        if n in out:
            continue
        stem = _NOT_IDENTIFIER.sub("_", n)[:MAX_NAME_LENGTH].strip("_") or "t"
        base = ident = (OUTPUT_PREFIX if n in outputs else INPUT_PREFIX) + stem
        count = 0
        while ident in out.values():
            count += 1
            ident = f"{base}_{count}"
        out[n] = ident
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
