"""The library (search/, verifier/, db/, superopt/core) imports no front end: the front ends
present what the library produces, so a change to a command, a page or the Python API cannot
reach the search, the proofs or the cache, and the library loads without them."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The library's folders and the package each is installed as (pyproject.toml's package-dir).
LIBRARY = {"search": "superopt.search", "verifier": "superopt.verifier", "db": "superopt.db",
           "superopt/core": "superopt.core"}

# The front ends, each with why the library may not import it (a module or anything under it).
FRONT_ENDS = {
    "superopt.api": "the Python API: it calls the search and the cache, not the other way round",
    "superopt.cli": "the command line: printing and exit codes",
    "superopt.service": "the HTTP service: routes, request schemas and status codes",
    "superopt.worker": "the worker process: it drives the queue and the optimizer",
    "superopt.batch": "batch runs of the command line",
    "superopt.dashboard": "the web dashboard's pages",
    "superopt.dashboard_data": "what the dashboard shows, shaped for its pages",
    "superopt.report": "the HTML report of a batch",
    "superopt.render": "text renderings for people",
    "superopt.jobs_render": "the command line's tables of jobs and kernels",
    "superopt.charts": "SVG charts for the dashboard and the report",
    "superopt.frontends": "model importers and torch.compile: they load PyTorch and ONNX",
}
# The package face (`import superopt`, `from superopt import optimize`) hands out the Python
# API's names; `from superopt import ops` imports the submodule superopt.ops and is judged as that.
FACE = "superopt"


def _module_name(path: Path, root: Path) -> str:
    for folder, package in LIBRARY.items():
        base = root / folder
        if path.is_relative_to(base):
            parts = path.relative_to(base).with_suffix("").parts
            return ".".join((package, *parts)).removesuffix(".__init__")
    raise ValueError(f"{path} is not in the library")


def _is_submodule(name: str, root: Path) -> bool:
    """Whether superopt.<name> is a module or package of superopt/ (else a name the face defines)."""
    return (root / "superopt" / f"{name}.py").exists() or (root / "superopt" / name / "__init__.py").exists()


def _imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """Every module `path` imports, anywhere in it (lazy and TYPE_CHECKING imports included)."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            if base == FACE:
                found += [(node.lineno, f"{FACE}.{a.name}" if _is_submodule(a.name, root) else FACE)
                          for a in node.names]
            else:
                found.append((node.lineno, base))
    return found


def violations(root: Path) -> list[str]:
    """Each import of a front end by a library module under `root`: 'file:line: module (why)'."""
    found = []
    for folder in LIBRARY:
        for path in sorted((root / folder).rglob("*.py")):
            for line, name in _imports(path, root):
                why = "the package face: it hands out the Python API's names" if name == FACE else next(
                    (r for m, r in FRONT_ENDS.items() if name == m or name.startswith(f"{m}.")), None)
                if why:
                    found.append(f"{path.relative_to(root)}:{line}: {name} ({why})")
    return found


def test_the_library_imports_no_front_end() -> None:
    assert violations(REPO) == []


def test_every_front_end_named_exists() -> None:
    """A front end renamed or removed is renamed or removed here too, or the check guards nothing."""
    for name in FRONT_ENDS:
        path = REPO / Path(*name.split("."))
        assert path.with_suffix(".py").exists() or (path / "__init__.py").exists(), name


def test_the_check_sees_each_form_of_import(tmp_path: Path) -> None:
    """Absolute, relative, lazy and face imports of a front end are all caught."""
    (tmp_path / "superopt" / "core").mkdir(parents=True)
    (tmp_path / "superopt" / "api.py").write_text("")
    (tmp_path / "superopt" / "ops.py").write_text("")
    (tmp_path / "superopt" / "core" / "__init__.py").write_text("")
    (tmp_path / "superopt" / "core" / "x.py").write_text(
        "import superopt\nfrom superopt import ops, optimize\nfrom .. import api\n"
        "def f():\n    from superopt.cli import main\n")
    for folder in ("search", "verifier", "db"):
        (tmp_path / folder).mkdir()
    lines = [v.split(": ", 1)[1].split(" (")[0] for v in violations(tmp_path)]
    assert lines == ["superopt", "superopt", "superopt.api", "superopt.cli"]


def _front_ends_loaded(code: str) -> list[str]:
    """The front ends in sys.modules after `code` runs in a fresh interpreter."""
    report = (f"import sys; print(sorted(m for m in sys.modules for f in {sorted(FRONT_ENDS)!r} "
              "if m == f or m.startswith(f + '.')))")
    out = subprocess.run([sys.executable, "-c", f"{code}\n{report}"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return ast.literal_eval(out.stdout)


@pytest.mark.parametrize("order", [("search", "verifier", "db"), ("verifier", "db", "search"),
                                   ("db", "search", "verifier")])
def test_each_package_imports_alone_and_in_any_order(order: tuple[str, str, str]) -> None:
    """No import cycle among the packages, whichever a program imports first."""
    assert _front_ends_loaded("; ".join(f"import superopt.{p}" for p in order)) == []


def test_every_library_module_loads_without_a_front_end() -> None:
    """Through the superopt modules the library uses too (a front end reached indirectly)."""
    code = ("import importlib, pkgutil, superopt.core, superopt.db, superopt.search, superopt.verifier\n"
            "for pkg in (superopt.core, superopt.db, superopt.search, superopt.verifier):\n"
            "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
            "        if '.migrations' not in m.name:  # alembic runs these, inside its own context\n"
            "            importlib.import_module(m.name)")
    assert _front_ends_loaded(code) == []


@pytest.mark.parametrize("package", ["superopt.search", "superopt.verifier", "superopt.db"])
def test_each_package_surface_is_what_it_says(package: str) -> None:
    """`__all__`, the names loaded on first use and the names typed for checkers agree; each is
    the object its module defines, and none is also a submodule's name (the two would clash)."""
    module = importlib.import_module(package)
    path = Path(module.__file__ or "")
    block = next(node for node in ast.parse(path.read_text()).body
                 if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    typed = {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    lazy = {name: home for home, names in module._SURFACE.items() for name in names}
    assert sorted(module.__all__) == sorted(lazy) and lazy == typed
    for name, home in lazy.items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), name
        assert not (path.parent / f"{name}.py").exists(), name
