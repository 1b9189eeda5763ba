"""Test helpers for OpenTelemetry: a real SDK provider with in-memory or file exporters.

The API's global provider can be set only once per process; tests swap it by
resetting the API's own once-guard, so each test starts from "no provider".
Worker subprocesses record to a file of one JSON span per line (``TEST_TRACE_FILE``),
written as each span ends, so the spans of a SIGKILLed worker that had ended are there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

TRACE_FILE_ENV = "TEST_TRACE_FILE"


def _set_global(provider: Any) -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    if provider is not None:
        trace.set_tracer_provider(provider)


def install(exporter: Any) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _set_global(provider)
    return provider


def uninstall() -> None:
    """Back to the API's proxy provider: tracing inactive."""
    _set_global(None)


def in_memory() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    install(exporter)
    return exporter


def record_to_file(path: str) -> None:
    handle = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    install(
        ConsoleSpanExporter(
            out=handle, formatter=lambda span: json.dumps(json.loads(span.to_json())) + "\n"
        )
    )


def read_file(path: Path) -> list[dict[str, Any]]:
    """The spans a subprocess wrote: dicts with name, context, parent_id, attributes."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def by_name(spans: list[Any], name: str) -> list[Any]:
    return [s for s in spans if (s["name"] if isinstance(s, dict) else s.name) == name]


def hex_id(value: int, width: int) -> str:
    return f"0x{value:0{width}x}"


def ids(span: ReadableSpan) -> tuple[str, str]:
    """(trace id, span id) of an SDK span as the JSON form spells them."""
    assert span.context is not None
    return hex_id(span.context.trace_id, 32), hex_id(span.context.span_id, 16)
