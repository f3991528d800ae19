"""What a user may hand over, in one place: the name grammar, ranks, sizes and search budgets.

Programs arrive from strangers (HTTP bodies, batch files) and end up in database rows, in the
header comments of generated CUDA and in a worker's memory. They are checked against these limits
when they are validated (`superopt.program`), before anything is stored or searched, so that both
database backends only ever see programs within them; a job request's budgets are checked by
`superopt.jobspec` and `superopt.api.optimize`. Every refusal names the node or field and the limit.

Names (program names and node ids) are data, never code: the grammar keeps them to characters that
can break out of neither a comment nor a terminal line, and code generation builds identifiers
from them only through `superopt.codegen.names` (letters and digits kept, the rest replaced, a
prefix no keyword or built-in has). The size limits are configurable through the environment,
for machines larger or smaller than the defaults assume.
"""

from __future__ import annotations

import os
import re

NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]*")
MAX_NAME_LENGTH = 64
NAME_RULE = (f"a name is 1 to {MAX_NAME_LENGTH} characters from A-Z a-z 0-9 _ . : - and starts with a letter "
             "or _")

MAX_NODES = 128  # a search space grows exponentially with the program; larger ones are split
MAX_RANK = 8  # dimensions of any tensor of a program
INDEX_LIMIT = 2**31 - 1  # elements of a tensor: generated kernels index with 32-bit integers
# Elements of one tensor, and bytes of all of a program's tensors in their dtypes: a worker holds
# them all on its device and the reference evaluator holds them in float64, so the defaults keep a
# program well inside one GPU and one worker's memory.
MAX_TENSOR_ELEMENTS = 2**28
MAX_PROGRAM_BYTES = 4 * 2**30
TENSOR_ELEMENTS_ENV = "SUPEROPT_MAX_TENSOR_ELEMENTS"
PROGRAM_BYTES_ENV = "SUPEROPT_MAX_PROGRAM_BYTES"

MAX_BUDGET_S = 7 * 24 * 3600  # seconds: a week, the longest search a job may ask for
MAX_STATES = 10**12  # far beyond any budget that ends, within what every database stores


class LimitConfigError(ValueError):
    """A limit set in the environment that is not one (SUPEROPT_MAX_TENSOR_ELEMENTS=abc): the
    operator's mistake, told in one line by the CLI rather than as a traceback."""


def name_problem(name: object) -> str | None:
    """Why `name` is not a valid program name or node id (None when it is)."""
    if not isinstance(name, str):
        return f"expected a string, got {type(name).__name__}"
    if len(name) > MAX_NAME_LENGTH:
        return f"{len(name)} characters; at most {MAX_NAME_LENGTH}"
    if not NAME_PATTERN.fullmatch(name):
        return NAME_RULE
    return None


def printable(text: str) -> str:
    """`text` with every character that does not print (escape sequences, carriage returns,
    bidirectional overrides) written as its Python escape: text read from the database (a
    program name, a job's error) can then neither clear a terminal, set its title nor hide text."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def shown(name: object) -> str:
    """`name` quoted for an error message: escaped (repr) and cut short, so that a hostile name
    can neither flood the message nor put control characters on a terminal."""
    if isinstance(name, str) and len(name) > MAX_NAME_LENGTH:
        return f"{name[:MAX_NAME_LENGTH]!r}... ({len(name)} characters)"
    return repr(name)


def max_tensor_elements() -> int:
    """Elements one tensor may have: SUPEROPT_MAX_TENSOR_ELEMENTS, else the default (never above
    what 32-bit indexing reaches)."""
    return _env_limit(TENSOR_ELEMENTS_ENV, MAX_TENSOR_ELEMENTS, INDEX_LIMIT)


def max_program_bytes() -> int:
    """Bytes a program's tensors may take together in their dtypes: SUPEROPT_MAX_PROGRAM_BYTES,
    else the default."""
    return _env_limit(PROGRAM_BYTES_ENV, MAX_PROGRAM_BYTES, None)


def _env_limit(var: str, default: int, ceiling: int | None) -> int:
    """A positive integer limit from the environment, read at each check so that a deployment (or
    a test) that sets it is obeyed; a value that is not one is a configuration error."""
    raw = os.environ.get(var)
    if raw is None or not raw.strip():
        return default
    text = raw.strip()
    value = int(text) if text.isascii() and text.isdigit() else 0  # (int() takes "５" and "1_000" too)
    if value < 1 or (ceiling is not None and value > ceiling):
        bound = f" at most {ceiling:,}" if ceiling is not None else ""
        raise LimitConfigError(f"{var}: expected a positive integer{bound}, got {raw!r}")
    return value


def check_budgets(budget_s: float | None, max_states: int | None) -> None:
    """Refuse a search budget outside (0, MAX_BUDGET_S] seconds or [1, MAX_STATES] states (None:
    no limit), naming the field and the bound, as a job request's are refused."""
    if budget_s is not None and (isinstance(budget_s, bool) or not isinstance(budget_s, int | float)):
        raise ValueError(f"budget_s: must be a number of seconds (or None: no time limit), got {budget_s!r}")
    if max_states is not None and (isinstance(max_states, bool) or not isinstance(max_states, int)):
        raise ValueError(f"max_states: must be an integer (or None: no limit), got {max_states!r}")
    if budget_s is not None and not 0 < budget_s <= MAX_BUDGET_S:
        raise ValueError(f"budget_s: must be greater than 0 and at most {MAX_BUDGET_S} s (or None: no time limit), "
                         f"got {budget_s}")
    if max_states is not None and not 1 <= max_states <= MAX_STATES:
        raise ValueError(f"max_states: must be at least 1 and at most {MAX_STATES:,} (or None: no limit), "
                         f"got {max_states}")
