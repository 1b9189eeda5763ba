"""The OpenAPI document is valid OpenAPI 3.1, and every schema in it valid JSON Schema 2020-12.

The meta-schema is the OpenAPI Initiative's ``schema/2022-10-07`` for 3.1, as
schemathesis (already a test dependency) ships it; ``jsonschema_rs`` (its
validator) checks against it. That schema deliberately leaves the JSON Schema
objects inside unchecked, so each is checked against the 2020-12 meta-schema too.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
import pytest
from schemathesis.specs.openapi.definitions import OPENAPI_31

from durable.api.openapi import build_document

DOCUMENT = build_document("/api/")
OPENAPI_31_VALIDATOR = jsonschema_rs.Draft202012Validator(OPENAPI_31)


def schemas(document: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Every Schema Object: components, parameters, headers, request and response bodies."""
    for name, schema in document["components"]["schemas"].items():
        yield f"components.schemas.{name}", schema
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            where = f"{method.upper()} {path}"
            for parameter in operation.get("parameters", []):
                yield f"{where} parameter {parameter['name']}", parameter["schema"]
            bodies = [("request", operation.get("requestBody", {}))]
            bodies += [(status, r) for status, r in operation.get("responses", {}).items()]
            for label, body in bodies:
                for media, content in body.get("content", {}).items():
                    yield f"{where} {label} {media}", content["schema"]
                for header, spec in body.get("headers", {}).items():
                    yield f"{where} {label} header {header}", spec["schema"]


def test_document__is_valid_openapi_3_1():
    OPENAPI_31_VALIDATOR.validate(DOCUMENT)


SCHEMAS = list(schemas(DOCUMENT))
DIALECT = "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize(("where", "schema"), SCHEMAS, ids=[where for where, _ in SCHEMAS])
def test_document__every_schema_is_valid_json_schema_2020_12(where, schema):
    jsonschema_rs.meta.validate({"$schema": DIALECT, **schema})


def test_document__the_meta_schema_check_does_refuse_a_broken_document():
    broken = copy.deepcopy(DOCUMENT)
    broken["paths"]["/api/jobs"]["get"]["parameters"][0]["in"] = "body"  # OpenAPI 2 style
    assert not OPENAPI_31_VALIDATOR.is_valid(broken)
    no_description = copy.deepcopy(DOCUMENT)
    del no_description["paths"]["/api/jobs"]["get"]["responses"]["200"]["description"]
    assert not OPENAPI_31_VALIDATOR.is_valid(no_description)
    assert not jsonschema_rs.meta.is_valid({"type": "integer", "minimum": "one"})


def test_document__every_operation_id_is_unique():
    ids = [op["operationId"] for methods in DOCUMENT["paths"].values() for op in methods.values()]
    assert len(ids) == len(set(ids))
