"""The generated reference pages cover what the code has (docs/_ext/generate.py)."""

from __future__ import annotations

import argparse
import functools

import generate
import pytest

from durable.api.openapi import build_document

commands_markdown = functools.cache(generate.commands_markdown)


def test_every_command_of_our_apps_is_in_the_commands_reference() -> None:
    text = commands_markdown()
    commands = generate.our_commands()
    assert {"runworker", "enqueue_job", "credential", "problems", "ensure_admin"} <= set(commands)
    for name in commands:
        assert f"### `{name}`" in text


@pytest.mark.parametrize("name", sorted(generate.our_commands()))
def test_every_option_of_every_command_is_documented(name: str) -> None:
    text = commands_markdown()
    section = text.split(f"### `{name}`", 1)[1].split("\n### `", 1)[0]
    parsers = [
        generate.command_parser(name),
        *generate._subparsers(generate.command_parser(name)).values(),
    ]
    for parser in parsers:
        for action in generate._ours(parser):
            for option in action.option_strings:
                assert f"`{option}" in section, f"{name}: {option} is not in the reference"
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                assert f"`{generate._metavar(action)}`" in section


def test_the_http_reference_is_the_served_document() -> None:
    served = generate.served_openapi()
    assert served == build_document("/api/")
    text = generate.openapi_markdown(served)
    for path, item in served["paths"].items():
        for method in item:
            if method != "parameters":
                assert f"### `{method.upper()} {path}`" in text
    for schema in served["components"]["schemas"]:
        assert f"### {schema}\n" in text


def test_the_job_state_tables_follow_the_engine() -> None:
    text = generate.job_states_markdown()
    # Two facts of the restart and action tables the generated tables must state,
    # read from durable.states.
    assert (
        "| `failed` | refused | refused | refused | → `queued`, due now, attempts reset |" in text
    )
    assert "| `cancelling` | cancelled | cancelled | cancelled |" in text
