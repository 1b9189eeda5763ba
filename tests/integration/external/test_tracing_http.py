"""Outbound HTTP calls of a unit are CLIENT spans of that unit, and carry its trace on."""

from __future__ import annotations

import pytest
from opentelemetry import trace

from durable import jobs, tracing
from tests import traces

from ..helpers import drain
from ..servers import Reply

pytestmark = pytest.mark.django_db(transaction=True)


def test_http_call__is_a_child_span_of_its_unit_and_sends_traceparent(spans, http_server, provider):
    name = provider()
    http_server.reply("/ok", Reply(200, {}, b"fine"))
    http_server.reply("/gone", Reply(404, {}, b"no"))
    base = http_server.url("")
    secret_query = "?api_key=sk_live_should_never_be_an_attribute"
    job = jobs.enqueue(
        "test.http_calls", {"base": base, "paths": ["/ok" + secret_query], "provider": name}
    )
    assert drain(job.pk).state == "completed"

    finished = spans.get_finished_spans()
    (unit,) = traces.by_name(finished, "unit test.http_calls")
    (get,) = traces.by_name(finished, "GET")
    assert get.kind == trace.SpanKind.CLIENT
    assert get.parent.span_id == unit.context.span_id
    assert get.context.trace_id == unit.context.trace_id
    assert get.attributes["http.response.status_code"] == 200
    assert get.attributes["url.path"] == "/ok"
    assert get.attributes["server.address"] == "127.0.0.1"
    values = " ".join(str(v) for s in finished for v in s.attributes.values())
    assert "sk_live" not in values

    [seen] = http_server.requests()
    traceparent = seen.header("traceparent")
    assert traceparent is not None
    _version, trace_id, span_id, _flags = traceparent.split("-")
    assert (int(trace_id, 16), int(span_id, 16)) == (get.context.trace_id, get.context.span_id)

    failing = jobs.enqueue("test.http_calls", {"base": base, "paths": ["/gone"], "provider": name})
    drain(failing.pk)
    gets = [s for s in traces.by_name(spans.get_finished_spans(), "GET") if s is not get]
    assert gets
    assert all(s.attributes["http.response.status_code"] == 404 for s in gets)
    assert all(s.status.status_code == trace.StatusCode.ERROR for s in gets)
    assert (
        tracing.OUTCOME
        in traces.by_name(spans.get_finished_spans(), "run test.http_calls")[-1].attributes
    )
