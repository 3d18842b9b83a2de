"""`Endpoint`: the one value every client takes for a server, and the only writer of its key's header."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import deploykit
from deploykit.endpoint import Endpoint

KEY = "sk-very-secret-1234"
PACKAGE = Path(deploykit.__file__).parent
# The one writer, and the two modules that read an incoming header or redact one in text.
ALLOWED = {"endpoint.py", "vllm_plugin/status_route.py", "net.py"}


def test_a_key_is_sent_as_a_bearer_token() -> None:
    assert Endpoint("http://h:8000", api_key=KEY).headers() == {"Authorization": f"Bearer {KEY}"}


@pytest.mark.parametrize("key", [None, ""])
def test_no_key_or_an_empty_one_sends_no_header(key: str | None) -> None:
    endpoint = Endpoint("http://h:8000", api_key=key)
    assert endpoint.headers() == {} and endpoint.api_key is None and endpoint.secrets == []
    assert Endpoint("http://h:8000", api_key=KEY).with_key(key).headers() == {}


def test_the_key_is_never_shown() -> None:
    endpoint = Endpoint("http://user:pw@h:8000/", api_key=KEY)
    assert KEY not in repr(endpoint) and KEY not in str(endpoint)
    assert KEY not in repr(endpoint.with_request_deadline(5)) and endpoint.secrets == [KEY]
    assert "pw" not in endpoint.shown


def test_at_joins_paths_under_the_base_url() -> None:
    endpoint = Endpoint("http://h:8000/")
    assert endpoint.url == "http://h:8000"
    assert endpoint.at("/v1/models") == endpoint.at("v1/models") == "http://h:8000/v1/models"
    assert Endpoint("http://h:8000/prefix").at("/metrics") == "http://h:8000/prefix/metrics"


def _writes_bearer(source: str) -> list[int]:
    """Lines that build an Authorization header: a `{"Authorization": ...}` dict, or a string (plain or f)
    that begins with `Bearer ` (a docstring naming the scheme in prose is not one)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            if any(key.lower() == "authorization" for key in keys):
                lines.append(node.lineno)
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and str(first.value).lower().startswith("bearer "):
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.lower().startswith("bearer ")
        ):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_only_the_endpoint_writes_the_authorization_header() -> None:
    """A client that built its own header would be a second place a key travels loose."""
    writers = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        found = _writes_bearer(path.read_text(encoding="utf-8"))
        if found and name not in ALLOWED:
            writers[name] = found
    assert writers == {}, f"build the header with Endpoint.headers(): {writers}"
    assert _writes_bearer((PACKAGE / "endpoint.py").read_text(encoding="utf-8"))  # the check finds one
