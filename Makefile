# make demo: set up .venv (when missing) and run the main job on the embedded defaults.
# make test: set up .venv (when missing) and run the test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.superopt-installed
# Tests run on every core (pytest-xdist); those in one xdist_group (the Ray tests) share a worker.
PYTEST_ARGS ?= -n auto --dist loadgroup

.PHONY: demo test lint typecheck docs clean

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/superopt demo

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# superopt/ as the installed package; search/, verifier/ and db/ from their source folders.
typecheck: $(STAMP)
	$(PY) -m mypy -p superopt
	$(PY) -m mypy search verifier db

# Regenerate the references (docs/cli.md, docs/http.md, docs/python.md) from the code, then build
# the site into site/ (offline; a broken link or anchor fails the build).
docs: $(STAMP)
	$(PY) scripts/gen_docs.py
	$(PY) -m mkdocs build --strict

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
