"""Which secrets the credential resolver refuses: a pure table, no database."""

import pytest

from durable.policy import MAX_SECRET_BYTES, secret_problem


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("tok-1234", None),
        ("abcd", None),  # the shortest value redaction protects
        ("pass word with spaces", None),  # inner spaces are fine (SMTP passwords)
        ("pässwörd-ünïcode", None),
        ("x" * MAX_SECRET_BYTES, None),
        ("abc", "shorter than 4"),  # never redacted from messages
        ("", "shorter than 4"),
        ("x" * (MAX_SECRET_BYTES + 1), "longer than"),
        ("é" * (MAX_SECRET_BYTES // 2 + 1), "longer than"),  # counted in UTF-8 bytes
        ("tok\nen-value", "control character"),  # h11 would quote it in its error
        ("tok\ren-value", "control character"),
        ("tok\ten-value", "control character"),
        ("tok\x00en-value", "control character"),
        ("tok\x7fen-value", "control character"),
        ("tok\u2028en-value", "control character"),  # Unicode line separator
    ],
)
def test_secret_problem__table(value, problem):
    found = secret_problem(value)
    if problem is None:
        assert found is None
    else:
        assert problem in found
        assert value not in found or not value  # the reason never quotes the value
