"""Where superopt keeps its files: the user's cache directory, overridable for tests and servers;
and how it writes them, whole, when processes share them (`write_atomically`).

$SUPEROPT_CACHE_DIR, else $XDG_CACHE_HOME/superopt, else ~/.cache/superopt.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    explicit = os.environ.get("SUPEROPT_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "superopt"


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` so that a reader sees the old file or the new one, never a part.
    Processes that write the same path (two jobs of one program at two shapes store one
    shape-reuse file) each write a temporary file of their own in the same folder (a rename is
    atomic within one file system) and rename it over `path`: the last rename wins, whole."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
