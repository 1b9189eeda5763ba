import pytest

from durable.errors import InputRejected
from durable.sanitize import clean_input, looks_like_credential_key


@pytest.mark.parametrize(
    "key",
    ["password", "db_password", "apiKey", "api_key", "API-KEY", "token", "accessToken",
     "client_secret", "Authorization", "cookie", "private_key", "session_id", "secret"],
)  # fmt: skip
def test_credential_keys__are_refused_with_a_hint(key):
    with pytest.raises(InputRejected) as info:
        clean_input({"nested": {key: "hunter2"}}, max_bytes=65536)
    assert info.value.field == f"nested.{key}"
    assert "_ref" in info.value.reason


@pytest.mark.parametrize(
    "key", ["author", "max_tokens", "tokenizer", "path", "authority", "secretary_name"]
)
def test_ordinary_keys__are_not_mistaken_for_credentials(key):
    assert not looks_like_credential_key(key)


def test_credential_reference__is_accepted_when_it_is_a_name():
    assert clean_input({"token_ref": "github-ci"}, max_bytes=1000) == {"token_ref": "github-ci"}


def test_credential_reference__refuses_a_pasted_secret():
    with pytest.raises(InputRejected, match="reference must be a name"):
        clean_input({"token_ref": "Bearer abc def"}, max_bytes=1000)


@pytest.mark.parametrize(
    "value",
    ["Bearer abcdefghijklmnop", "-----BEGIN RSA PRIVATE KEY-----", "ghp_abcdefghijklmnopqrstu"],
)
def test_secret_looking_values__are_refused_under_any_key(value):
    with pytest.raises(InputRejected, match="looks like a secret"):
        clean_input({"note": value}, max_bytes=1000)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1, 2], "JSON object"),
        ("text", "JSON object"),
        ({"when": object()}, "not a JSON value"),
        ({"x": float("nan")}, "NaN"),
        ({1: "x"}, "keys must be strings"),
        ({"note": "a\x00b"}, "NUL character"),  # PostgreSQL jsonb refuses \u0000
        ({"a\x00": 1}, "NUL character"),
        ({"note": "\ud800"}, "unpaired surrogate"),
    ],
)
def test_non_json_input__is_refused(value, message):
    with pytest.raises(InputRejected, match=message):
        clean_input(value, max_bytes=1000)


def test_oversized_input__is_refused_with_its_size():
    with pytest.raises(InputRejected, match="limit is 1024"):
        clean_input({"blob": "x" * 2000}, max_bytes=1024)


def test_deeply_nested_input__is_refused():
    value: dict = {}
    node = value
    for _ in range(40):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(InputRejected, match="nested deeper"):
        clean_input(value, max_bytes=100_000)


def test_none__is_an_empty_input():
    assert clean_input(None, max_bytes=10) == {}
