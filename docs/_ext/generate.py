"""Reference pages written from the code at build time: commands, HTTP API, job states.

Each function returns MyST Markdown; durable_docs writes it under
docs/reference/_generated/ (not committed) where the reference pages include it.
Nothing is copied by hand, so the reference cannot drift from the code.
"""

from __future__ import annotations

import argparse
import json
import warnings
from typing import Any

# Options every Django command has; listed once on the page instead of per command.
DJANGO_DEFAULT_OPTIONS = {
    "help",
    "version",
    "verbosity",
    "settings",
    "pythonpath",
    "traceback",
    "no_color",
    "force_color",
    "skip_checks",
}
APPS = ("durable", "recovery")


def _cell(text: object) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: object) -> str:
    text = str(text)
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


# --- management commands ---------------------------------------------------------------------


def our_commands() -> dict[str, str]:
    """Command name -> app label, for the commands of durable and recovery."""
    from django.core.management import get_commands

    found = {}
    for name, app in get_commands().items():
        label = app.rsplit(".", 1)[-1]
        if label in APPS:
            found[name] = label
    return dict(sorted(found.items()))


def command_parser(name: str) -> argparse.ArgumentParser:
    from django.core.management import get_commands, load_command_class

    return load_command_class(get_commands()[name], name).create_parser("manage.py", name)


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest.upper()


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def _synopsis_part(action: argparse.Action) -> str:
    if not action.option_strings:
        part = _metavar(action)
        if action.nargs in ("*", "?"):
            return f"[{part}{' …' if action.nargs == '*' else ''}]"
        if action.nargs == "+":
            return f"{part} …"
        return part
    option = max(action.option_strings, key=len)
    part = f"{option} {_metavar(action)}" if _takes_value(action) else option
    if isinstance(action, argparse._AppendAction):
        part += " …"
    return part if action.required else f"[{part}]"


def _ours(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if a.dest not in DJANGO_DEFAULT_OPTIONS and not isinstance(a, argparse._SubParsersAction)
    ]


def _default(action: argparse.Action) -> str:
    if not _takes_value(action) or action.default in (None, argparse.SUPPRESS, [], ()):
        return ""
    return _code('""' if action.default == "" else action.default)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    return _cell(parser._get_formatter()._expand_help(action))


def _options_table(parser: argparse.ArgumentParser) -> list[str]:
    actions = _ours(parser)
    if not actions:
        return ["No options of its own.", ""]
    lines = ["| Argument | Default | Meaning |", "|---|---|---|"]
    for action in actions:
        if action.option_strings:
            names = ", ".join(
                _code(f"{o} {_metavar(action)}" if _takes_value(action) else o)
                for o in action.option_strings
            )
        else:
            names = _code(_metavar(action))
        meaning = _help(parser, action)
        if action.choices is not None and action.option_strings:
            meaning = (
                (meaning + " " if meaning else "")
                + "One of "
                + ", ".join(_code(c) for c in action.choices)
                + "."
            )
        if isinstance(action, argparse._AppendAction):
            meaning = (meaning + " " if meaning else "") + "Repeatable."
        if action.required and action.option_strings:
            meaning = "**Required.** " + meaning
        lines.append(f"| {names} | {_default(action)} | {meaning} |")
    return [*lines, ""]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def commands_markdown() -> str:
    lines = [
        "Every command also takes Django's own options (`--verbosity`, `--settings`, "
        "`--pythonpath`, `--traceback`, `--no-color`, `--force-color`, `--skip-checks`, "
        "`--help`); they are not repeated below.",
        "",
    ]
    for name, app in our_commands().items():
        parser = command_parser(name)
        subs = _subparsers(parser)
        synopsis = " ".join(
            ["python manage.py", name]
            + [_synopsis_part(a) for a in _ours(parser)]
            + (["{" + ",".join(subs) + "}"] if subs else [])
        )
        lines += [f"### `{name}`", ""]
        if parser.description:
            lines += [" ".join(parser.description.split()), ""]
        lines += [f"From the `{app}` app.", "", "```text", synopsis, "```", ""]
        lines += _options_table(parser)
        for sub_name, sub in subs.items():
            sub_synopsis = " ".join(
                ["python manage.py", name, sub_name] + [_synopsis_part(a) for a in _ours(sub)]
            )
            lines += [f"#### `{name} {sub_name}`", ""]
            if sub.description:
                lines += [" ".join(sub.description.split()), ""]
            lines += ["```text", sub_synopsis, "```", ""]
            lines += _options_table(sub)
    return "\n".join(lines)


# --- HTTP API (the served OpenAPI document) --------------------------------------------------


def served_openapi() -> dict[str, Any]:
    """The document exactly as the site serves it at /api/openapi.json (Django's test client)."""
    from django.test import Client

    with warnings.catch_warnings():
        # WhiteNoise warns when collectstatic has not run; the API does not need it.
        warnings.simplefilter("ignore")
        response = Client(HTTP_HOST="127.0.0.1").get("/api/openapi.json")
    if response.status_code != 200:
        raise RuntimeError(f"/api/openapi.json answered {response.status_code}")
    return json.loads(response.content)


def _schema_anchor(name: str) -> str:
    return f"schema-{name.lower()}"


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_schema_anchor(name)})"
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return " or ".join(_type(s) for s in schema[key])
    kind = schema.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    parts = []
    for k in kinds:
        if k == "array":
            parts.append("array of " + _type(schema.get("items", {})))
        else:
            fmt = schema.get("format")
            parts.append(f"{k} ({fmt})" if fmt and k != "null" else k)
    text = " \\| ".join(parts)
    if "enum" in schema:
        text += ": " + ", ".join(_code(json.dumps(v)) for v in schema["enum"])
    limits = []
    for key, label in (
        ("minimum", "≥"),
        ("maximum", "≤"),
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
    ):
        if key in schema:
            limits.append(f"{label} {schema[key]}")
    if limits:
        text += " (" + ", ".join(limits) + ")"
    return text


def _properties(schema: dict[str, Any]) -> list[str]:
    props = schema.get("properties") or {}
    if not props:
        return []
    required = set(schema.get("required", []))
    lines = ["| Field | Type | Required | Meaning |", "|---|---|---|---|"]
    for name, sub in props.items():
        meaning = _cell(sub.get("description", ""))
        if "default" in sub:
            meaning += f" Default {_code(json.dumps(sub['default']))}."
        flag = "yes" if name in required else ""
        lines.append(f"| `{name}` | {_type(sub)} | {flag} | {meaning.strip()} |")
    return [*lines, ""]


def openapi_markdown(document: dict[str, Any]) -> str:
    info = document["info"]
    lines = [
        f"**{info['title']}**, version {info['version']} (OpenAPI {document['openapi']}). "
        + info.get("description", ""),
        "",
        "## Endpoints",
        "",
    ]
    for path, item in document["paths"].items():
        shared = item.get("parameters", [])
        for method, op in item.items():
            if method == "parameters":
                continue
            lines += [f"### `{method.upper()} {path}`", ""]
            if op.get("summary"):
                lines += [op["summary"], ""]
            if op.get("description"):
                lines += [op["description"], ""]
            scopes = sorted({s for req in op.get("security", []) for v in req.values() for s in v})
            if op.get("security") == []:
                lines += ["No token needed.", ""]
            elif scopes:
                lines += ["Scope: " + ", ".join(_code(s) for s in scopes) + ".", ""]
            params = shared + op.get("parameters", [])
            if params:
                lines += ["| Parameter | In | Type | Meaning |", "|---|---|---|---|"]
                for p in params:
                    req = " **Required.**" if p.get("required") else ""
                    lines.append(
                        f"| `{p['name']}` | {p['in']} | {_type(p.get('schema', {}))} | "
                        f"{_cell(p.get('description', ''))}{req} |"
                    )
                lines.append("")
            if body := op.get("requestBody"):
                for media, content in body.get("content", {}).items():
                    lines += [
                        f"Request body ({_code(media)}): {_type(content.get('schema', {}))}.",
                        "",
                    ]
            lines += ["| Status | Meaning | Body |", "|---|---|---|"]
            for status, response in op.get("responses", {}).items():
                bodies = ", ".join(
                    f"{_code(media)} {_type(content.get('schema', {}))}"
                    for media, content in response.get("content", {}).items()
                )
                headers = ", ".join(_code(h) for h in response.get("headers", {}))
                meaning = _cell(response.get("description", ""))
                if headers:
                    meaning += f" Headers: {headers}."
                lines.append(f"| {status} | {meaning} | {bodies} |")
            lines.append("")
    lines += ["## Schemas", ""]
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        lines += [f"({_schema_anchor(name)})=", f"### {name}", ""]
        if schema.get("description"):
            lines += [" ".join(schema["description"].split()), ""]
        props = _properties(schema)
        lines += props or [f"Type: {_type(schema)}.", ""]
        for example in schema.get("examples", [])[:2]:
            lines += ["```json", json.dumps(example, indent=2, ensure_ascii=False), "```", ""]
    return "\n".join(lines)


# --- job states -----------------------------------------------------------------------------


def job_states_markdown() -> str:
    from durable.states import (
        FINISHED_STATES,
        LEASED_STATES,
        Action,
        JobState,
        OnRestart,
        RestartOutcome,
        decide,
        on_restart,
    )

    lines = ["| State | Finished | A worker may hold its lease |", "|---|---|---|"]
    for state in JobState:
        lines.append(
            f"| `{state.value}` ({state.label}) | {'yes' if state in FINISHED_STATES else ''} | "
            f"{'yes' if state in LEASED_STATES else ''} |"
        )
    lines += [
        "",
        "## Operator actions",
        "",
        "What pause, resume, cancel and retry do in each state (`durable.states.decide`, "
        "the table the dashboard, the API and `durable.jobs` apply). *Held*: a live "
        "worker still holds the job's lease. *Already so*: acknowledged, nothing changes "
        "(a double click is harmless).",
        "",
        "| State | " + " | ".join(a.value for a in Action) + " |",
        "|---|" + "---|" * len(Action),
    ]

    def outcome(action: Action, state: JobState, held: bool) -> str:
        decision = decide(action, state, lease_held=held)
        if decision.refused:
            return "refused"
        parts = []
        if decision.new_state is not None:
            parts.append(f"→ `{decision.new_state.value}`")
        if decision.wake:
            parts.append("due now")
        if decision.reset_attempts:
            parts.append("attempts reset")
        return ", ".join(parts) or "already so"

    for state in JobState:
        cells = []
        for action in Action:
            free, held = outcome(action, state, False), outcome(action, state, True)
            cells.append(
                free if free == held or state not in LEASED_STATES else f"{free}; held: {held}"
            )
        lines.append(f"| `{state.value}` | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## After a worker stopped (`on_restart`)",
        "",
        "What happens to an unfinished job whose worker stopped or died, per restart "
        "policy (`durable.states.on_restart`). A queued job is failed by `fail` only on a "
        "cold start, and only if it was enqueued before the previous workers were last seen "
        "(see [the guarantees](../explanation/guarantees.md#guarantees-exactly)).",
        "",
        "| State found | " + " | ".join(f"`{p.value}`" for p in OnRestart) + " |",
        "|---|" + "---|" * len(OnRestart),
    ]
    said = {
        RestartOutcome.KEEP: "stays queued",
        RestartOutcome.FAIL: "failed (`server_restarted`)",
        RestartOutcome.REQUEUE_FROM_START: "queued; checkpoint and unit results dropped",
        RestartOutcome.RESUME: "queued with its checkpoint; the next claim continues from it",
        RestartOutcome.CANCEL: "cancelled",
        RestartOutcome.RELEASE: "stays paused; the dead worker's lease is dropped",
    }
    for state in JobState:
        if state in FINISHED_STATES:
            continue
        cells = [said[on_restart(state, policy)] for policy in OnRestart]
        lines.append(f"| `{state.value}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
