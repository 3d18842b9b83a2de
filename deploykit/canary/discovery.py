"""What the server at the canary's URL is and serves, from vLLM's `GET /v1/models`.

A canary pointed at something that is not vLLM (a web page, another service, a wrong port) must say so at
its first look, in one line, and never keep running against it: every run would be a "miss" and, minutes
later, an `unreachable` that hides the real mistake. Nothing answering at all is different: vLLM may still
be loading (the chart starts the canary beside it), so that is left to the runs, which count it as misses.
"""

from __future__ import annotations

from typing import Any

from deploykit.canary.defaults import IDENTIFY_TIMEOUT_S
from deploykit.endpoint import Endpoint
from deploykit.errors import CanaryError
from deploykit.smoke.bodies import describe_body

WAY_OUT = "give --url the vLLM server's base URL, e.g. http://127.0.0.1:8000"


def served_models(endpoint: Endpoint, timeout_s: float = IDENTIFY_TIMEOUT_S) -> list[dict[str, Any]] | None:
    """The models vLLM's `/v1/models` lists; None when nothing answered in time (refused, timed out, or
    busy: HTTP 5xx/429, whatever its body, as a proxy in front of a loading vLLM says). Raises CanaryError
    when something answered that is not vLLM, or that refuses the API key."""
    import json

    from deploykit.http_bounded import LISTING_CAP_BYTES, fetch

    where = f"{endpoint.shown}/v1/models"
    reply = fetch(
        endpoint.at("/v1/models"),
        headers=endpoint.headers(),
        deadline_s=timeout_s,
        max_bytes=LISTING_CAP_BYTES,
    )
    if reply.failure in ("deadline", "transport"):
        return None
    code = reply.status or 0
    if code >= 500 or code == 429:
        return None
    if reply.failure == "too_big":
        raise CanaryError(
            f"{where} answered HTTP {code}: {reply.problem}: this is not a vLLM server; {WAY_OUT}"
        )
    try:
        body = json.loads(reply.text)
    except (ValueError, RecursionError):
        body = None
    if code in (401, 403) and isinstance(body, dict):
        raise CanaryError(
            f"{where} answered HTTP {code}: the server wants an API key this canary does not have or has "
            "wrong; give --api-key-env NAME (or the profile's api_key_env) with the server's key"
        )
    models = body.get("data") if isinstance(body, dict) else None
    if code != 200 or not isinstance(models, list):
        what = (
            "JSON that is not a model list"
            if body is not None
            else describe_body(reply.text, reply.headers.get("content-type", ""))
        )
        raise CanaryError(f"{where} answered HTTP {code} with {what}: this is not a vLLM server; {WAY_OUT}")
    return [model for model in models if isinstance(model, dict)]


def model_ids(models: list[dict[str, Any]]) -> list[str]:
    return [str(model.get("id", "?")) for model in models]


def discover_model(endpoint: Endpoint, wanted: str | None) -> tuple[str, int | None]:
    """The served model (the first, or `wanted`) and its max_model_len, from vLLM's `/v1/models`."""
    models = served_models(endpoint, timeout_s=30)
    if models is None:
        raise CanaryError(
            f"cannot list the served models at {endpoint.shown}/v1/models (no answer, or the "
            "server is busy); start the server first, or give --profile"
        )
    for model in models:
        if isinstance(model.get("id"), str) and (wanted is None or model.get("id") == wanted):
            length = model.get("max_model_len")
            usable = isinstance(length, int) and not isinstance(length, bool) and length > 0
            return str(model["id"]), length if usable else None
    served = ", ".join(model_ids(models)) or "no model"
    raise CanaryError(f"{endpoint.shown} does not serve {wanted!r}; it serves {served}")


def identify(endpoint: Endpoint, served_name: str) -> bool:
    """The canary's first look at its server: True once vLLM answered and serves `served_name`, False when
    nothing answered yet (look again before the next run). Raises CanaryError when the URL is not a vLLM
    server, refuses the key, or serves other models (every run would be judged wrong, i.e. "corrupt")."""
    models = served_models(endpoint)
    if models is None:
        return False
    ids = model_ids(models)
    if served_name not in ids:
        raise CanaryError(
            f"{endpoint.shown} does not serve {served_name!r}; it serves {', '.join(ids) or 'no model'}: "
            "give --model NAME, or the profile of that server"
        )
    return True


def server_health_ok(endpoint: Endpoint, timeout_s: float) -> bool:
    """vLLM's own `/health` at the server's base URL answers 200 (it needs no API key)."""
    from deploykit.net import health_ok, health_url

    return health_ok(health_url(endpoint.url), timeout_s)
