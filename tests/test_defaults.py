"""One source for every default (issue 47): the command line's options, the HTTP schema, the
Python API and the job queue take their defaults from superopt.config, so none can drift."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import click
import typer
from typer.testing import CliRunner

from superopt import api, config, service, worker
from superopt.cli import app
from superopt.config import DEFAULT_CONFIG, SearchConfig
from superopt.db import engine
from superopt.db.jobs import JobQueue
from superopt.jobspec import ConfigSpec, JobRequest

BOUNDS = [f.name for f in dataclasses.fields(SearchConfig)]


def commands() -> dict[str, click.Command]:
    """Every command of the app by its path ("optimize", "cache ls")."""
    root = typer.main.get_command(app)
    found: dict[str, click.Command] = {}

    def walk(group: Any, prefix: str) -> None:
        for name, cmd in group.commands.items():
            path = f"{prefix} {name}".strip()
            found[path] = cmd
            if isinstance(cmd, click.Group):
                walk(cmd, path)

    walk(root, "")
    return found


def option(command: str, name: str) -> click.Parameter:
    return next(p for p in commands()[command].params if p.name == name)


def test_config_spec_is_search_config_field_for_field():
    assert list(ConfigSpec.model_fields) == BOUNDS
    for f in dataclasses.fields(SearchConfig):
        spec = ConfigSpec.model_fields[f.name]
        assert spec.default == f.default == getattr(DEFAULT_CONFIG, f.name)
        assert spec.description == f.metadata["description"]
    assert ConfigSpec().to_config() == DEFAULT_CONFIG == JobRequest(program="gqa").search_config()


def test_every_bound_option_has_the_config_default_and_the_schema_range():
    for command in ("optimize", "submit"):
        for name in BOUNDS:
            opt = option(command, name)
            assert opt.default == getattr(DEFAULT_CONFIG, name), (command, name)
            meta = config.bound(name).metadata
            if "ge" in meta:
                schema = ConfigSpec.model_json_schema()["properties"][name]
                assert (schema["minimum"], schema["maximum"]) == (meta["ge"], meta["le"])
                assert f"({meta['ge']} to {meta['le']})" in (opt.help or ""), (command, name)


def test_budgets_and_service_and_worker_options_take_the_config_defaults():
    expected = {
        ("optimize", "budget_s"): config.DEFAULT_BUDGET_S, ("submit", "budget_s"): config.DEFAULT_BUDGET_S,
        ("batch", "budget_s"): config.DEFAULT_BUDGET_S,
        ("serve", "host"): config.SERVE_HOST, ("serve", "port"): config.SERVE_PORT,
        ("serve", "max_body_bytes"): config.MAX_BODY_BYTES, ("serve", "body_timeout_s"): config.BODY_TIMEOUT_S,
        ("worker", "lease_s"): config.LEASE_S, ("worker", "poll_s"): config.POLL_S,
        ("worker", "db_retry_s"): config.DB_RETRY_S,
    }
    for (command, name), value in expected.items():
        assert option(command, name).default == value, (command, name)
    assert JobRequest.model_fields["budget_s"].default == config.DEFAULT_BUDGET_S
    assert inspect.signature(api.optimize).parameters["budget_s"].default == config.DEFAULT_BUDGET_S
    assert inspect.signature(JobQueue.submit).parameters["budget_s"].default == config.DEFAULT_BUDGET_S
    assert inspect.signature(JobQueue.__init__).parameters["lease_s"].default == config.LEASE_S
    params = inspect.signature(worker.Worker.__init__).parameters
    assert (params["lease_s"].default, params["poll_s"].default, params["db_retry_s"].default) == (
        config.LEASE_S, config.POLL_S, config.DB_RETRY_S)
    params = inspect.signature(service.create_app).parameters
    assert (params["max_body_bytes"].default, params["body_timeout_s"].default) == (
        config.MAX_BODY_BYTES, config.BODY_TIMEOUT_S)


def test_environment_variables_are_options_that_help_names():
    """The variables the command line reads are its options' envvar, so --help shows them."""
    assert config.DB_URL_ENV == engine.ENV_URL
    for command, cmd in commands().items():
        db = next((p for p in cmd.params if p.name == "db"), None)
        if db is not None:
            assert db.envvar == config.DB_URL_ENV, command
    assert option("serve", "token").envvar == config.TOKEN_ENV
    assert option("serve", "allowed_host").envvar == config.HOSTS_ENV
    res = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200", config.TOKEN_ENV: "s3cret-token"})
    assert res.exit_code == 0
    for name in (config.DB_URL_ENV, config.TOKEN_ENV, config.HOSTS_ENV):
        assert name in res.output
    assert "s3cret-token" not in res.output  # the token is never shown as a default


def test_one_default_target_everywhere():
    """run, verify and export defaulted to h100 while optimize and submit took auto."""
    with_target = {path: cmd for path, cmd in commands().items()
                   if any(p.name == "target" for p in cmd.params) and not path.startswith("cache")}
    assert {"show", "run", "verify", "optimize", "demo", "submit", "batch", "export"} <= set(with_target)
    for path in with_target:
        opt = option(path, "target")
        assert opt.default == config.DEFAULT_TARGET == "auto", path
        assert config.TARGET_HELP in (opt.help or ""), path
    assert JobRequest.model_fields["target"].default == config.DEFAULT_TARGET
    assert inspect.signature(api.optimize).parameters["target"].default == config.DEFAULT_TARGET
    assert inspect.signature(JobQueue.submit).parameters["target"].default == config.DEFAULT_TARGET
