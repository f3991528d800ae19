"""The documentation stays true to the code.

- Every `superopt ...` line of a shell block (```sh, ```bash or a bare ```) in README.md and
  docs/*.md runs and exits 0, in the order of its page, through typer's CliRunner. Each page gets
  a fresh cache directory and a working directory holding a copy of docs/, and built-in
  workloads run at their small `:ci` shape with budgets of at most `BUDGET_CAP_S`. A line ending
  in `# needs: WHAT` (a GPU, a Ray cluster, PostgreSQL, a terminal of its own) is skipped, with
  WHAT as the reason, unless WHAT names only Python packages that are installed (`torch`,
  `onnx`). `> FILE` after a command writes its output to FILE.
- Every ```python block of those pages runs (a `# needs: ...` line in it works as above), in the
  same sequence as the commands of its page and sharing one namespace per page.
- Every ```json block that is a program loads.
- The generated references (docs/cli.md, docs/http.md, docs/python.md) equal what
  scripts/gen_docs.py generates now: whoever changes a command, a route or a documented
  signature runs `.venv/bin/python scripts/gen_docs.py` and commits the pages.
- The op table of docs/programs.md names every op and attribute; the README stays short and its
  quick start is two commands; the site builds with `mkdocs build --strict` (when mkdocs is
  installed).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from scripts_loader import load_script
from typer.testing import CliRunner

from superopt import ops, workloads
from superopt.cli import app
from superopt.program import SCHEMA, Program

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 160
BUDGET_CAP_S = 30.0
SHELL = ("", "sh", "bash", "shell")
NEEDS = re.compile(r"#\s*needs:\s*(?P<what>.+?)\s*$")
PACKAGES = ("torch", "onnx")  # needs that are Python packages: met when installed
ENV = ("SUPEROPT_DB_URL", "SUPEROPT_SECRET", "SUPEROPT_TOKEN", "SUPEROPT_ALLOWED_HOSTS",
       "SUPEROPT_MAX_TENSOR_ELEMENTS", "SUPEROPT_MAX_PROGRAM_BYTES", "XDG_CACHE_HOME")


GEN = load_script("gen_docs")
GENERATED = sorted(GEN.PAGES)
PAGES = [README, *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name not in GENERATED)]


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the block's first line of text
    lang: str
    text: str


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page."""
    found: list[Block] = []
    lang: str | None = None
    start, body = 0, list[str]()
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        fence = re.match(r"^\s*```\s*([\w-]*)\s*$", line)
        if lang is None and fence:
            lang, start, body = fence.group(1), n + 1, []
        elif lang is not None and line.strip() == "```":
            found.append(Block(path.name, start, lang, "\n".join(body)))
            lang = None
        elif lang is not None:
            body.append(line)
    return found


@dataclass(frozen=True)
class Step:
    """One example of a page, run in page order: a `superopt` command line or a Python block."""

    page: str
    line: int
    kind: str  # "command" | "python"
    text: str
    needs: str | None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def steps(path: Path) -> list[Step]:
    out: list[Step] = []
    for b in blocks(path):
        if b.lang == "python":
            needs = next((m.group("what") for m in map(NEEDS.search, b.text.splitlines()) if m), None)
            out.append(Step(b.page, b.line, "python", b.text, needs))
        elif b.lang in SHELL:
            for i, line in enumerate(b.text.splitlines()):
                if line.startswith("superopt "):
                    m = NEEDS.search(line)
                    out.append(Step(b.page, b.line + i, "command", line, m.group("what") if m else None))
    return out


STEPS = {p.name: steps(p) for p in PAGES}


def unmet(needs: str | None) -> str | None:
    """Why a step cannot run here (None: it can): what it needs, less the installed packages."""
    if needs is None:
        return None
    wants = [w.strip() for w in re.split(r",|\band\b", re.sub(r"\(.*?\)", "", needs)) if w.strip()]
    if all(w in PACKAGES for w in wants):
        absent = [w for w in wants if importlib.util.find_spec(w) is None]
        return f"needs {' and '.join(absent)}" if absent else None
    return f"needs {needs}"


def ci_args(line: str) -> tuple[list[str], str | None]:
    """The command's arguments, at :ci shapes and capped budgets, and the file `>` names."""
    tokens = shlex.split(line, comments=True)[1:]
    target = None
    if ">" in tokens:
        i = tokens.index(">")
        tokens, target = tokens[:i], tokens[i + 1]
    args = []
    for i, tok in enumerate(tokens):
        base = tok.split(":")[0]
        if base in workloads.WORKLOADS and (tok == base or tok.count(":") == 1):
            tok = f"{base}:ci"
        elif i > 0 and tokens[i - 1] == "--budget-s":
            tok = f"{min(float(tok), BUDGET_CAP_S):g}"
        args.append(tok)
    return args, target


class Workspace:
    """A page's working directory (a copy of docs/) and cache directory, and how many of its
    steps have run there."""

    def __init__(self, root: Path) -> None:
        if root.exists():
            shutil.rmtree(root)
        self.cwd, self.cache = root / "work", root / "cache"
        shutil.copytree(ROOT / "docs", self.cwd / "docs")
        shutil.copytree(ROOT / "scripts" / "programs", self.cwd / "scripts" / "programs")
        self.done = 0
        self.namespace: dict[str, Any] = {"__name__": "__docs__"}  # the page's Python blocks share it


_workspaces: dict[str, Workspace] = {}


def run_step(step: Step, ws: Workspace) -> None:
    if step.kind == "python":
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(step.text, step.id, "exec"), ws.namespace)
        return
    args, target = ci_args(step.text)
    res = CliRunner().invoke(app, args)
    detail = f"{step.id}: `superopt {shlex.join(args)}` exited {res.exit_code}\n{res.output}"
    if res.exc_info and not isinstance(res.exception, SystemExit):
        import traceback

        detail += "".join(traceback.format_exception(*res.exc_info))
    assert res.exit_code == 0, detail
    if target is not None:
        Path(target).write_text(res.stdout)


def _same_worker(page: str) -> list[Any]:
    """Under xdist, a page's examples run on one worker, in order (each replays what it needs
    otherwise, so this only saves time); without xdist its marker is not registered."""
    try:
        return [pytest.mark.xdist_group(f"docs-{page}")]
    except pytest.fail.Exception:
        return []


def _params() -> list[Any]:
    return [pytest.param(s, id=s.id, marks=_same_worker(s.page)) for page in STEPS.values() for s in page]


@pytest.mark.parametrize("step", _params())
def test_example_runs(step: Step, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    reason = unmet(step.needs)
    if reason:
        pytest.skip(reason)
    page = STEPS[step.page]
    index = page.index(step)
    ws = _workspaces.get(step.page)
    if ws is None or ws.done > index:  # first of its page here, or run out of order: start afresh
        ws = _workspaces[step.page] = Workspace(tmp_path_factory.getbasetemp() / f"docs-{step.page}")
    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(ws.cache))
    monkeypatch.chdir(ws.cwd)
    for earlier in page[ws.done:index]:  # the examples before it on its page, when they did not run here
        if unmet(earlier.needs) is None:
            run_step(earlier, ws)
        ws.done += 1
    ws.done = index + 1
    run_step(step, ws)


def test_every_page_has_examples() -> None:
    """The extraction finds what the pages hold (a changed fence style would silently test nothing)."""
    assert sum(s.kind == "command" for s in STEPS["README.md"]) >= 3
    assert any(s.kind == "python" for s in STEPS["README.md"])
    assert sum(s.kind == "command" and not s.needs for s in STEPS["guide.md"]) >= 20


@pytest.mark.parametrize("page", [p.name for p in PAGES])
def test_program_json_examples_load(page: str) -> None:
    path = README if page == README.name else ROOT / "docs" / page
    for b in blocks(path):
        if b.lang == "json":
            data = json.loads(b.text)
            if isinstance(data, dict) and data.get("schema") == SCHEMA:
                Program.from_json(data)


def test_readme_json_program_is_the_example_file() -> None:
    (program,) = [json.loads(b.text) for b in blocks(README) if b.lang == "json"]
    assert program == json.loads((ROOT / "docs" / "examples" / "rmsnorm_matmul.json").read_text())
    for f in sorted((ROOT / "docs" / "examples").glob("*.json")):
        data = json.loads(f.read_text())
        if data.get("schema") == SCHEMA:
            Program.from_json(data)


@pytest.mark.parametrize("name", GENERATED)
def test_generated_reference_is_current(name: str) -> None:
    fresh = GEN.PAGES[name]()
    current = (ROOT / "docs" / name).read_text()
    assert current == fresh, (f"docs/{name} differs from the code: run `.venv/bin/python scripts/gen_docs.py` "
                              "(or `make docs`) and commit the pages it writes")


def test_every_op_and_attribute_is_documented() -> None:
    text = (ROOT / "docs" / "programs.md").read_text()
    for name, spec in ops.OPS.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"docs/programs.md: no row for op {name!r} in the operations table"
        for attr in spec.attrs:
            assert f"`{attr}`" in row, f"docs/programs.md: op {name!r} row does not name attribute {attr!r}"


def test_readme_is_short_and_its_quick_start_is_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; at most {README_MAX_LINES}"
    start = lines.index("## Quick start")
    block = next(b for b in blocks(README) if b.line > start + 1)
    assert block.text.splitlines() == ["make demo", "make test"]


def test_site_builds_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
