"""The OpenAPI 3.1 description of this API, assembled from one part per resource.

``tests/integration/test_api*.py`` validate every response they receive
against this document, and a schemathesis run fuzzes a live server with it,
so a change to a view that is not made here too fails the suite.

Top to bottom: the pieces every part uses (references, problem responses, and
the queue, priority and operation fields, whose rules come from
``durable.rules`` and ``durable.api.parse``); the jobs part (schemas and
paths); the schedules part; ``build_document``, which puts the parts together
under the prefix where the URLconf mounted the API. A new resource adds a part
of its own and one line to ``build_document``.
"""

from __future__ import annotations

from typing import Any

from ..rules import PRIORITY_MAX, PRIORITY_MIN, QUEUE_NAME_PATTERN
from ..states import FINISHED_STATES, JobState, OnRestart
from .parse import (
    EVENTS_DEFAULT_LIMIT,
    EVENTS_MAX_LIMIT,
    LIST_DEFAULT_LIMIT,
    LIST_MAX_LIMIT,
    MAX_BATCH_JOBS,
    MAX_ID,
    MAX_IDEMPOTENCY_KEY,
    MAX_OPERATION_NAME,
    MAX_SCHEDULE_NAME,
)

ACTIONS = ("cancel", "pause", "resume", "retry")


# --- pieces every part uses -------------------------------------------------------------


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(type_: str, **extra: Any) -> dict[str, Any]:
    return {"type": [type_, "null"], **extra}


TIMESTAMP = {"type": "string", "format": "date-time"}
NULLABLE_TIMESTAMP = _nullable("string", format="date-time")


def _queue_field(description: str) -> dict[str, Any]:
    return {"type": ["string", "null"], "pattern": QUEUE_NAME_PATTERN, "description": description}


def _priority_field(description: str) -> dict[str, Any]:
    return {
        "type": ["integer", "null"],
        "minimum": PRIORITY_MIN,
        "maximum": PRIORITY_MAX,
        "description": description,
    }


def _operation_field(description: str) -> dict[str, Any]:
    return {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_OPERATION_NAME,
        "description": description,
    }


def _on_restart_field(description: str) -> dict[str, Any]:
    return {
        "type": ["string", "null"],
        "enum": [*OnRestart.values, None],
        "description": description,
    }


def _idempotency_key(description: str) -> dict[str, Any]:
    return {
        "name": "Idempotency-Key",
        "in": "header",
        "description": description,
        "schema": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_IDEMPOTENCY_KEY,
            "pattern": "^[!-~]+$",
        },
    }


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": _ref("Problem")}},
    }


def _json(description: str, schema: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}


# Every call that authenticates reads the database: while it is unreachable, a 503.
DATABASE_UNAVAILABLE = {
    **_problem(
        "The database cannot be reached right now (`code` database_unavailable); "
        "try again after Retry-After seconds."
    ),
    "headers": {
        "Retry-After": {"required": True, "schema": {"type": "string", "pattern": "^[0-9]+$"}}
    },
}
AUTH_PROBLEMS = {
    "503": DATABASE_UNAVAILABLE,
    "401": {
        **_problem("Missing, malformed, unknown or revoked token."),
        "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
    },
    "403": {
        **_problem(
            "The token lacks a scope this needs: the method's, or `jobs:admin` for a "
            "privileged operation or another client's job (`code` insufficient_scope, "
            "with a WWW-Authenticate challenge); or the operation is never started "
            "through the API (`code` operation_not_allowed)."
        ),
        "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
    },
}
BODY_PROBLEMS = {
    "400": _problem("Malformed JSON or invalid fields; `errors` says which."),
    "411": _problem("A chunked body: send it with a Content-Length."),
    "413": _problem("The body is larger than DURABLE_API_MAX_BODY_BYTES."),
    "415": _problem("The body is not application/json."),
}


def _limit(default: int, maximum: int) -> dict[str, Any]:
    return {
        "name": "limit",
        "in": "query",
        "schema": {"type": "integer", "minimum": 1, "maximum": maximum, "default": default},
    }


PROBLEM_SCHEMAS: dict[str, Any] = {
    "Problem": {
        "type": "object",
        "description": "RFC 9457 problem details; `code` is stable, `detail` is for people.",
        "required": ["type", "title", "status", "code", "detail"],
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "code": {"type": "string"},
            "detail": {"type": "string"},
            "state": {"type": "string", "description": "409 only: the job's current state."},
            "errors": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["field", "message"],
                    "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
                },
            },
        },
    },
}


# --- jobs -----------------------------------------------------------------------------

JOB_FIELDS = [
    "id", "url", "events_url", "operation", "state", "finished", "owner", "tenant",
    "queue", "priority", "on_restart", "input", "checkpoint", "progress", "attempts",
    "max_attempts", "next_attempt_at", "last_error", "reason", "error_code",
    "last_event_seq", "created_at", "updated_at", "started_at", "finished_at",
]  # fmt: skip
TASK_RESULT_FIELDS = [
    "id", "task", "backend", "status", "finished", "queue", "priority", "args", "kwargs",
    "has_return_value", "return_value", "errors", "worker_ids", "attempts", "steps_done",
    "steps_total", "enqueued_at", "started_at", "last_attempted_at", "finished_at",
]  # fmt: skip

# One value of ``state``: an empty one, or job states separated by commas (spaces allowed).
_STATE = "|".join(JobState.values)
STATE_LIST = f"^( *({_STATE}) *(, *({_STATE}) *)*| *)$"
JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_ID},
}


JOB_SCHEMAS: dict[str, Any] = {
    "JobSubmission": {
        "type": "object",
        "required": ["operation"],
        "examples": [
            {"operation": "durable.noop", "input": {"units": 3}},
            {"operation": "durable.noop", "queue": "default", "priority": 5, "on_restart": "retry"},
        ],
        "additionalProperties": False,
        "properties": {
            "operation": _operation_field("A registered operation, e.g. `durable.noop`."),
            "input": {
                "type": ["object", "null"],
                "description": "The operation's input: JSON, no secrets (pass `*_ref` names). "
                "Absent or null: `{}`.",
            },
            "queue": _queue_field("Absent or null: the operation's queue."),
            "priority": _priority_field(
                "Higher runs first. Absent or null: the operation's. A whole number; `5.0` is `5`."
            ),
            "on_restart": _on_restart_field("Absent or null: the operation's policy."),
        },
    },
    "JobBatchSubmission": {
        "type": "object",
        "required": ["operation", "inputs"],
        "examples": [{"operation": "durable.noop", "inputs": [{"units": 1}, {"units": 2}]}],
        "additionalProperties": False,
        "properties": {
            "operation": _operation_field("A registered operation, e.g. `durable.noop`."),
            "inputs": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_BATCH_JOBS,
                "items": {"type": ["object", "null"]},
                "description": "One job per input (null: `{}`). Every input is checked "
                "before any job is written; the first bad one is reported as "
                "`inputs[<index>].<field>` and nothing is created.",
            },
            "queue": _queue_field("For every job. Absent or null: the operation's queue."),
            "priority": _priority_field("For every job. Absent or null: the operation's."),
            "on_restart": _on_restart_field(
                "For every job. Absent or null: the operation's policy."
            ),
        },
    },
    "JobBatch": {
        "type": "object",
        "required": ["count", "created", "jobs"],
        "properties": {
            "count": {"type": "integer", "minimum": 1, "description": "Inputs submitted."},
            "created": {
                "type": "integer",
                "minimum": 0,
                "description": "New jobs; the others matched an unfinished job's unique key.",
            },
            "jobs": {
                "type": "array",
                "description": "One job per input, in input order.",
                "items": {
                    "allOf": [
                        _ref("Job"),
                        {
                            "type": "object",
                            "required": ["created"],
                            "properties": {
                                "created": {
                                    "type": "boolean",
                                    "description": "False: an unfinished job with the "
                                    "operation's unique key (or an earlier input's) was "
                                    "returned instead of a new one.",
                                }
                            },
                        },
                    ]
                },
            },
        },
    },
    "Job": {
        "type": "object",
        "required": JOB_FIELDS,
        "properties": {
            "id": {"type": "integer", "minimum": 1},
            "url": {"type": "string"},
            "events_url": {"type": "string"},
            "operation": {"type": "string"},
            "state": {"type": "string", "enum": list(JobState.values)},
            "finished": {"type": "boolean"},
            "owner": {"type": "string", "description": "`api:<client name>` for API jobs."},
            "tenant": {"type": "string"},
            "queue": {"type": "string"},
            "priority": {"type": "integer"},
            "on_restart": {"type": "string", "enum": list(OnRestart.values)},
            "input": {"type": "object"},
            "checkpoint": {"description": "Operation-defined JSON, or null before the first unit."},
            "progress": {
                "type": "object",
                "required": ["units_done", "units_total", "fraction"],
                "properties": {
                    "units_done": {"type": "integer", "minimum": 0},
                    "units_total": _nullable("integer", minimum=0),
                    "fraction": _nullable("number", minimum=0, maximum=1),
                },
            },
            "attempts": {"type": "integer", "minimum": 0, "description": "Failed attempts."},
            "max_attempts": {"type": "integer", "minimum": 1},
            "next_attempt_at": TIMESTAMP,
            "last_error": {
                "oneOf": [
                    {"type": "null"},
                    {
                        "type": "object",
                        "required": ["at", "attempt", "error_class", "message", "retryable"],
                        "properties": {
                            "at": {"type": "string"},
                            "attempt": {"type": "integer"},
                            "error_class": {"type": "string"},
                            "message": {"type": "string"},
                            "retryable": {"type": "boolean"},
                        },
                    },
                ]
            },
            "reason": {"type": "string", "description": "Why it is paused or failed."},
            "error_code": {"type": "string"},
            "last_event_seq": {"type": "integer", "minimum": 0},
            "created_at": TIMESTAMP,
            "updated_at": TIMESTAMP,
            "started_at": NULLABLE_TIMESTAMP,
            "finished_at": NULLABLE_TIMESTAMP,
        },
    },
    "TaskResult": {
        "type": "object",
        "description": "A Django task's result, as Django's TaskResult has it; the job's "
        "id is the result id. Error tracebacks stay on the dashboard.",
        "required": TASK_RESULT_FIELDS,
        "properties": {
            "id": {"type": "string", "pattern": "^[1-9][0-9]*$"},
            "task": {"type": "string", "description": "The task function's dotted path."},
            "backend": {"type": "string", "description": "The TASKS alias."},
            "status": {"type": "string", "enum": ["READY", "RUNNING", "SUCCESSFUL", "FAILED"]},
            "finished": {"type": "boolean"},
            "queue": {"type": "string"},
            "priority": {"type": "integer"},
            "args": {"type": "array"},
            "kwargs": {"type": "object"},
            "has_return_value": {"type": "boolean"},
            "return_value": {"description": "JSON; null unless SUCCESSFUL (or returned null)."},
            "errors": {
                "type": "array",
                "description": "One per failed attempt, oldest first; a cancelled task "
                "ends with durable.tasks.TaskCancelled.",
                "items": {
                    "type": "object",
                    "required": ["exception_class_path", "message"],
                    "properties": {
                        "exception_class_path": {"type": "string"},
                        "message": {"type": "string"},
                    },
                },
            },
            "worker_ids": {"type": "array", "items": {"type": "string"}},
            "attempts": {"type": "integer", "minimum": 0, "description": "Runs started."},
            "steps_done": _nullable("integer", minimum=0),
            "steps_total": _nullable("integer", minimum=0),
            "enqueued_at": TIMESTAMP,
            "started_at": NULLABLE_TIMESTAMP,
            "last_attempted_at": NULLABLE_TIMESTAMP,
            "finished_at": NULLABLE_TIMESTAMP,
        },
    },
    "JobEvent": {
        "type": "object",
        "required": ["seq", "kind", "message", "data", "created_at"],
        "properties": {
            "seq": {"type": "integer", "minimum": 1, "description": "1, 2, 3… with no gaps."},
            "kind": {"type": "string"},
            "message": {"type": "string"},
            "data": {"type": "object"},
            "created_at": TIMESTAMP,
        },
    },
    "StreamEvent": {
        "description": "One event of a `text/event-stream` body, as an SSE client "
        "dispatches it (WHATWG HTML, server-sent events): its type `event` (`message` when "
        "the frame names none), `data`, and `id`, the last event id seen on the "
        "connection. OpenAPI 3.1 has no way to say that a schema describes each event "
        "rather than the whole body: this one does. One `message` per job event, `id` "
        "its seq and `data` the JobEvent as JSON; once the job is finished, one `end` "
        "with a StreamEnd. The stream starts with `retry: 2000` (a frame without data, "
        "so no event) and may carry comment lines (`: keep-alive`).",
        "oneOf": [
            {
                "type": "object",
                "required": ["event", "id", "data"],
                "additionalProperties": False,
                "properties": {
                    "event": {"const": "message"},
                    "id": {"type": "string", "pattern": "^[1-9][0-9]*$"},
                    "data": {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": _ref("JobEvent"),
                    },
                },
            },
            {
                "type": "object",
                "required": ["event", "data"],
                "additionalProperties": False,
                "properties": {
                    "event": {"const": "end"},
                    "id": {"type": "string", "pattern": "^[1-9][0-9]*$"},
                    "data": {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": _ref("StreamEnd"),
                    },
                },
            },
        ],
    },
    "StreamEnd": {
        "type": "object",
        "required": ["state", "last_event_seq"],
        "additionalProperties": False,
        "properties": {
            "state": {
                "type": ["string", "null"],
                "enum": [*sorted(FINISHED_STATES), None],
                "description": "null: the job was deleted while the stream was open.",
            },
            "last_event_seq": {"type": "integer", "minimum": 0},
        },
    },
    "JobPage": {
        "type": "object",
        "required": ["jobs", "next_cursor", "next"],
        "properties": {
            "jobs": {"type": "array", "items": _ref("Job")},
            "next_cursor": _nullable("string", description="Pass as `cursor`; null: last page."),
            "next": _nullable("string", description="The next page's URL."),
        },
    },
    "EventPage": {
        "type": "object",
        "required": ["job_id", "state", "finished", "events", "next_after", "has_more"],
        "properties": {
            "job_id": {"type": "integer"},
            "state": {"type": "string", "enum": list(JobState.values)},
            "finished": {"type": "boolean"},
            "events": {"type": "array", "items": _ref("JobEvent")},
            "next_after": {"type": "integer", "minimum": 0, "description": "Pass as `after`."},
            "has_more": {"type": "boolean"},
        },
    },
}

ACTION_SCHEMAS: dict[str, Any] = {
    "ActionResult": {
        "type": "object",
        "required": ["action", "applied", "job"],
        "properties": {
            "action": {"type": "string", "enum": list(ACTIONS)},
            "applied": {
                "type": "boolean",
                "description": "false: the job already was in the requested condition.",
            },
            "job": _ref("Job"),
        },
    },
}


def _list_jobs() -> dict[str, Any]:
    """``GET /jobs``."""
    return {
        "operationId": "listJobs",
        "summary": "Jobs, newest first, keyset-paginated.",
        "security": [{"bearer": ["jobs:read"]}],
        "parameters": [
            {
                "name": "state",
                "in": "query",
                "description": "Jobs in any of these states. Repeatable, and each "
                "value may list several, comma-separated (`state=failed,paused`). "
                "An empty value is no filter.",
                "style": "form",
                "explode": True,
                "schema": {
                    "type": "array",
                    "items": {"type": "string", "pattern": STATE_LIST},
                },
            },
            {
                "name": "operation",
                "in": "query",
                "description": "Jobs of this operation. Empty: no filter.",
                "schema": {"type": "string", "maxLength": MAX_OPERATION_NAME},
            },
            {
                "name": "cursor",
                "in": "query",
                "description": "`next_cursor` of the previous page (opaque). "
                "Empty: the first page.",
                "schema": {"type": "string"},
            },
            _limit(LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT),
        ],
        "responses": {
            "200": _json("A page of jobs.", "JobPage"),
            "400": _problem("A bad parameter; `errors` says which."),
            **AUTH_PROBLEMS,
        },
    }


def _submit_job() -> dict[str, Any]:
    """``POST /jobs``."""
    return {
        "operationId": "submitJob",
        "summary": "Submit a job; it is committed before the 202 is sent.",
        "security": [{"bearer": ["jobs:write"]}],
        "parameters": [
            _idempotency_key(
                "Repeating the request with the same key and body "
                "returns the first response (same job), also after a restart. "
                "Scoped to the client; kept for the retention period."
            )
        ],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _ref("JobSubmission")}},
        },
        "responses": {
            "202": {
                **_json("Accepted: the job is stored.", "Job"),
                "headers": {
                    "Location": {"schema": {"type": "string"}, "required": True},
                    "Idempotent-Replayed": {
                        "description": "With Idempotency-Key: true for a replay.",
                        "schema": {"type": "string", "enum": ["true", "false"]},
                    },
                },
            },
            "400": _problem("Malformed JSON, invalid fields or unknown operation."),
            **AUTH_PROBLEMS,
            "411": _problem("A chunked body: send it with a Content-Length."),
            "413": _problem("The body is larger than DURABLE_API_MAX_BODY_BYTES."),
            "415": _problem("The body is not application/json."),
            "422": _problem("The Idempotency-Key was used with a different body."),
        },
    }


def _batch_paths(base: str) -> dict[str, Any]:
    """``POST /jobs/batch``: many jobs of one operation, all or none."""
    return {
        f"{base}/jobs/batch": {
            "post": {
                "operationId": "submitJobBatch",
                "summary": "Submit many jobs of one operation; all are committed, or none, "
                "before the 202 is sent.",
                "security": [{"bearer": ["jobs:write"]}],
                "parameters": [
                    _idempotency_key(
                        "Repeating the request with the same key and body "
                        "returns the first response (same jobs). Kept while the batch's "
                        "first job is unfinished, and for the retention period."
                    )
                ],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("JobBatchSubmission")}},
                },
                "responses": {
                    "202": {
                        **_json("Accepted: every job is stored.", "JobBatch"),
                        "headers": {
                            "Idempotent-Replayed": {
                                "description": "With Idempotency-Key: true for a replay.",
                                "schema": {"type": "string", "enum": ["true", "false"]},
                            },
                        },
                    },
                    "400": _problem(
                        "Malformed JSON, invalid fields or inputs, or unknown "
                        "operation; nothing was created."
                    ),
                    **AUTH_PROBLEMS,
                    "411": _problem("A chunked body: send it with a Content-Length."),
                    "413": _problem("The body is larger than DURABLE_API_MAX_BODY_BYTES."),
                    "415": _problem("The body is not application/json."),
                    "422": _problem("The Idempotency-Key was used with a different body."),
                },
            },
        },
    }


def _job_paths(base: str) -> dict[str, Any]:
    """One job: itself, its task result, its events."""
    return {
        f"{base}/jobs/{{job_id}}": {
            "get": {
                "operationId": "getJob",
                "summary": "A job: state, checkpoint, progress, attempts, last error, times.",
                "security": [{"bearer": ["jobs:read"]}],
                "parameters": [JOB_ID],
                "responses": {
                    "200": _json("The job.", "Job"),
                    **AUTH_PROBLEMS,
                    "404": _problem("No such job."),
                },
            }
        },
        f"{base}/jobs/{{job_id}}/result": {
            "get": {
                "operationId": "getTaskResult",
                "summary": "A Django task's result: status, return value, errors, workers.",
                "security": [{"bearer": ["jobs:read"]}],
                "parameters": [JOB_ID],
                "responses": {
                    "200": _json("The task result.", "TaskResult"),
                    **AUTH_PROBLEMS,
                    "404": _problem("No such job, or the job is not a Django task."),
                },
            }
        },
        f"{base}/jobs/{{job_id}}/events": {
            "get": {
                "operationId": "jobEvents",
                "summary": "The job's events after a sequence number, as JSON or SSE.",
                "description": "With `Accept: text/event-stream`: server-sent events, one per "
                "job event with `id: <seq>`, resuming after `Last-Event-ID`; an `end` event "
                "when the job is finished. A stream lasts at most DURABLE_API_STREAM_SECONDS; "
                "reconnect with Last-Event-ID (EventSource does). 204 when the job is "
                "finished and nothing follows the given position; 503 when the server "
                "process already serves DURABLE_API_MAX_STREAMS streams.",
                "security": [{"bearer": ["jobs:read"]}],
                "parameters": [
                    JOB_ID,
                    {
                        "name": "after",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 0, "maximum": MAX_ID},
                    },
                    _limit(EVENTS_DEFAULT_LIMIT, EVENTS_MAX_LIMIT),
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "description": "Overrides `after` (reconnecting SSE clients send "
                        f"it): a seq from 0 to {MAX_ID}; empty is none.",
                        "schema": {"type": "string", "pattern": "^[0-9]{0,19}$"},
                    },
                ],
                "responses": {
                    "200": {
                        "description": "A page of events, or an event stream.",
                        "content": {
                            "application/json": {"schema": _ref("EventPage")},
                            "text/event-stream": {"schema": _ref("StreamEvent")},
                        },
                    },
                    "204": {"description": "Event stream: the job is finished, nothing follows."},
                    "400": _problem("A bad parameter; `errors` says which."),
                    **AUTH_PROBLEMS,
                    "404": _problem("No such job."),
                    "503": {
                        **_problem(
                            "Event stream: this server process already serves "
                            "DURABLE_API_MAX_STREAMS streams (`code` too_many_streams); or the "
                            "database cannot be reached (`code` database_unavailable). "
                            "Reconnect after Retry-After."
                        ),
                        "headers": {
                            "Retry-After": {
                                "required": True,
                                "schema": {"type": "string", "pattern": "^[0-9]+$"},
                            }
                        },
                    },
                },
            }
        },
    }


def _action(name: str) -> dict[str, Any]:
    return {
        "post": {
            "operationId": f"{name}Job",
            "summary": f"{name.capitalize()} a job (the dashboard's atomic transition).",
            "description": "No request body. 200 when applied or already so; 409 when the "
            "job's state does not allow it. A client acts on the jobs it submitted; on "
            "other jobs only with the `jobs:admin` scope.",
            "parameters": [JOB_ID],
            "security": [{"bearer": ["jobs:write"]}],
            "responses": {
                "200": _json("Applied, or the job already was so.", "ActionResult"),
                **AUTH_PROBLEMS,
                "404": _problem("No such job."),
                "409": _problem("The job's state does not allow this action."),
            },
        }
    }


def _openapi_path(base: str) -> dict[str, Any]:
    """This document itself."""
    return {
        f"{base}/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document.",
                "security": [],
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
    }


def _jobs_paths(base: str) -> dict[str, Any]:
    """Every path of the jobs part, in the document's order."""
    paths: dict[str, Any] = {f"{base}/jobs": {"get": _list_jobs(), "post": _submit_job()}}
    paths.update(_batch_paths(base))
    paths.update(_job_paths(base))
    paths.update(_openapi_path(base))
    for action in ACTIONS:
        paths[f"{base}/jobs/{{job_id}}/{action}"] = _action(action)
    return paths


# --- schedules ------------------------------------------------------------------------

SCHEDULE_FIELDS = [
    "id", "url", "name", "operation", "input", "cron", "interval", "interval_seconds",
    "time_zone", "rule", "catch_up", "overlap", "queue", "priority", "enabled", "managed",
    "next_run_at", "last_run_at", "created_at", "updated_at",
]  # fmt: skip

SCHEDULE_ID = {
    "name": "schedule_id",
    "in": "path",
    "required": True,
    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_ID},
}


SCHEDULE_SCHEMAS: dict[str, Any] = {
    "ScheduleSubmission": {
        "type": "object",
        "required": ["name", "operation"],
        "additionalProperties": False,
        "description": "A scheduled rule: every occurrence enqueues `operation` with `input`. "
        "Exactly one of `cron` and `interval`. Null means the default.",
        "examples": [
            {
                "name": "nightly-backup",
                "operation": "backup.database",
                "cron": "30 3 * * *",
                "time_zone": "Europe/Helsinki",
            },
            {
                "name": "scan-uploads",
                "operation": "integrity.scan",
                "interval": "6h",
                "input": {"storage": "default"},
                "enabled": False,
            },
        ],
        "properties": {
            "name": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_SCHEDULE_NAME,
                "description": "Unique; no tabs or line breaks.",
            },
            "operation": {"type": "string", "minLength": 1, "maxLength": MAX_OPERATION_NAME},
            "cron": {
                "type": ["string", "null"],
                "description": "5 fields (`30 3 * * *`, `*/15 * * * MON-FRI`) or @hourly, "
                "@daily, @weekly, @monthly, @yearly; on the wall clock of `time_zone`.",
            },
            "interval": {
                "type": ["string", "null"],
                "description": "Elapsed time: `90s`, `15m`, `1h`, `1d`, `2w` (a bare number "
                "is seconds); 0.1 s to 366 days.",
            },
            "input": {"type": ["object", "null"], "description": "The jobs' input; no secrets."},
            "time_zone": {
                "type": ["string", "null"],
                "description": "IANA name, for `cron`; empty or null: the site's TIME_ZONE.",
            },
            "catch_up": {
                "type": ["string", "null"],
                "enum": ["latest", "skip", None],
                "description": "After downtime: run the latest missed occurrence once "
                "(`latest`, the default), or none (`skip`).",
            },
            "overlap": {
                "type": ["boolean", "null"],
                "description": "Enqueue even while the previous occurrence's job is unfinished.",
            },
            "queue": _queue_field("Null: the operation's queue."),
            "priority": _priority_field("Null: the operation's priority."),
            "enabled": {"type": ["boolean", "null"], "description": "Null: true."},
        },
    },
    "SchedulePatch": {
        "type": "object",
        "required": ["enabled"],
        "additionalProperties": False,
        "properties": {
            "enabled": {
                "type": "boolean",
                "description": "Enabling starts from the first occurrence after now; those "
                "that fell while it was disabled are not caught up.",
            }
        },
    },
    "Occurrence": {
        "type": "object",
        "required": ["scheduled_for", "job_id", "job_url", "missed", "note"],
        "properties": {
            "scheduled_for": TIMESTAMP,
            "job_id": _nullable("integer", description="null: nothing was enqueued."),
            "job_url": _nullable("string"),
            "missed": {"type": "integer", "minimum": 0},
            "note": {"type": "string"},
        },
    },
    "Schedule": {
        "type": "object",
        "required": SCHEDULE_FIELDS,
        "properties": {
            "id": {"type": "integer", "minimum": 1},
            "url": {"type": "string"},
            "name": {"type": "string"},
            "operation": {"type": "string"},
            "input": {"type": "object"},
            "cron": _nullable("string", description="Normalised (macros expanded)."),
            "interval": _nullable("string", description="`15m`, `1h`, …"),
            "interval_seconds": _nullable("number"),
            "time_zone": _nullable("string", description="The zone cron follows; null: interval."),
            "rule": {"type": "string", "description": "For people: `cron 30 3 * * * (UTC)`."},
            "catch_up": {"type": "string", "enum": ["latest", "skip"]},
            "overlap": {"type": "boolean"},
            "queue": _nullable("string", description="null: the operation's."),
            "priority": _nullable("integer", description="null: the operation's."),
            "enabled": {"type": "boolean"},
            "managed": {
                "type": "boolean",
                "description": "Created from the site's settings: may be disabled, not deleted.",
            },
            "next_run_at": NULLABLE_TIMESTAMP,
            "last_run_at": NULLABLE_TIMESTAMP,
            "created_at": TIMESTAMP,
            "updated_at": TIMESTAMP,
            "recent_occurrences": {
                "type": "array",
                "description": "`GET /schedules/{id}` only: the latest applied occurrences, "
                "newest first.",
                "items": _ref("Occurrence"),
            },
        },
    },
    "SchedulePage": {
        "type": "object",
        "required": ["schedules", "next_cursor", "next"],
        "properties": {
            "schedules": {"type": "array", "items": _ref("Schedule")},
            "next_cursor": _nullable("string", description="Pass as `cursor`; null: last page."),
            "next": _nullable("string", description="The next page's URL."),
        },
    },
}

SCHEDULES_READ = [{"bearer": ["schedules:read"]}]
SCHEDULES_WRITE = [{"bearer": ["schedules:write"]}]
# Creating or enabling a schedule starts its operation again.
ADMIN_NOTE = (
    " The schedule's operation obeys the rule a submission does: never a system "
    "operation; a privileged one only with `jobs:admin` too."
)


def _schedule_collection_paths(base: str) -> dict[str, Any]:
    """``GET`` and ``POST /schedules``."""
    return {
        f"{base}/schedules": {
            "get": {
                "operationId": "listSchedules",
                "summary": "Scheduled rules, newest first, keyset-paginated.",
                "security": SCHEDULES_READ,
                "parameters": [
                    {
                        "name": "operation",
                        "in": "query",
                        "description": "Schedules of this operation. Empty: no filter.",
                        "schema": {"type": "string", "maxLength": MAX_OPERATION_NAME},
                    },
                    {
                        "name": "cursor",
                        "in": "query",
                        "description": "`next_cursor` of the previous page. Empty: the first.",
                        "schema": {"type": "string"},
                    },
                    _limit(LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT),
                ],
                "responses": {
                    "200": _json("A page of schedules.", "SchedulePage"),
                    "400": _problem("A bad parameter; `errors` says which."),
                    **AUTH_PROBLEMS,
                },
            },
            "post": {
                "operationId": "createSchedule",
                "summary": "Create a scheduled rule; its first occurrence is the first after now.",
                "description": "Names are unique, so repeating a create is safe: the repeat "
                "is `409`." + ADMIN_NOTE,
                "security": SCHEDULES_WRITE,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("ScheduleSubmission")}},
                },
                "responses": {
                    "201": {
                        **_json("Created.", "Schedule"),
                        "headers": {"Location": {"schema": {"type": "string"}, "required": True}},
                    },
                    **BODY_PROBLEMS,
                    **AUTH_PROBLEMS,
                    "409": _problem("A schedule with this name exists."),
                },
            },
        },
    }


def _schedule_paths(base: str) -> dict[str, Any]:
    """One schedule: read, enable or disable, delete."""
    return {
        f"{base}/schedules/{{schedule_id}}": {
            "get": {
                "operationId": "getSchedule",
                "summary": "A schedule, with its latest occurrences and the jobs they enqueued.",
                "security": SCHEDULES_READ,
                "parameters": [SCHEDULE_ID],
                "responses": {
                    "200": _json("The schedule.", "Schedule"),
                    **AUTH_PROBLEMS,
                    "404": _problem("No such schedule."),
                },
            },
            "patch": {
                "operationId": "setScheduleEnabled",
                "summary": "Enable or disable a schedule.",
                "description": "Enabling starts the operation again, so it obeys the rule "
                "a submission does: never a system operation; a privileged one only with "
                "`jobs:admin` too. Disabling needs `schedules:write` alone.",
                "security": SCHEDULES_WRITE,
                "parameters": [SCHEDULE_ID],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("SchedulePatch")}},
                },
                "responses": {
                    "200": _json("The schedule as it is now.", "Schedule"),
                    **BODY_PROBLEMS,
                    **AUTH_PROBLEMS,
                    "404": _problem("No such schedule."),
                },
            },
            "delete": {
                "operationId": "deleteSchedule",
                "summary": "Delete a schedule and its occurrence records (not its jobs).",
                "description": "A schedule the site manages from its settings cannot be "
                "deleted (`409`); disable it. Deleting stops work: `schedules:write` "
                "alone, whatever the operation.",
                "security": SCHEDULES_WRITE,
                "parameters": [SCHEDULE_ID],
                "responses": {
                    "204": {"description": "Deleted."},
                    **AUTH_PROBLEMS,
                    "404": _problem("No such schedule."),
                    "409": _problem("A schedule managed from the site's settings."),
                },
            },
        },
    }


# --- the document -----------------------------------------------------------------------

# Answered by gunicorn itself, before the application sees the request, so it is an
# HTML page rather than a problem document: any request can get it.
URI_TOO_LONG = {
    "description": "The request line is longer than the server reads (gunicorn's "
    "limit_request_line, 4094 bytes by default).",
    "content": {"text/html": {"schema": {"type": "string"}}},
}


def _with_server_limits(paths: dict[str, Any]) -> dict[str, Any]:
    for methods in paths.values():
        for operation in methods.values():
            operation["responses"].setdefault("414", URI_TOO_LONG)
    return paths


INFO = {
    "title": "Durable jobs API",
    "version": "1.0.0",
    "description": "Submit durable jobs and follow them. Authenticate with "
    "`Authorization: Bearer <token>` (`python manage.py create_api_client`). Scopes: "
    "`jobs:read`, `jobs:write`, `schedules:read`, `schedules:write`, and `jobs:admin` "
    "on top of them for privileged operations and other clients' jobs.",
}


def build_document(prefix: str = "/api/") -> dict[str, Any]:
    """The document, with paths under ``prefix`` (where the URLconf mounted the API)."""
    base = prefix.rstrip("/")
    paths = {
        **_jobs_paths(base),
        **_schedule_collection_paths(base),
        **_schedule_paths(base),
    }
    return {
        "openapi": "3.1.0",
        "info": INFO,
        "paths": _with_server_limits(paths),
        "components": {
            "schemas": {**PROBLEM_SCHEMAS, **JOB_SCHEMAS, **SCHEDULE_SCHEMAS, **ACTION_SCHEMAS},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
