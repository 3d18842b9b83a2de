"""What a smoke run passes around: the request to send, the exchange that came back, one case's result and
the report. Plain records, cheap to import: the store reads `CaseResult` from every row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

FIRST_IDS_KEPT = 32

Endpoint = Literal["/v1/completions", "/v1/chat/completions"]


class CaseResult(BaseModel):
    """One smoke request and what the verdict made of it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: str
    endpoint: str
    model: str
    passed: bool
    diagnosis: str = ""
    http_status: int | None = None
    latency_s: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    tokens_per_s: float | None = None
    first_ids: list[int] = Field(default_factory=list, description=f"first {FIRST_IDS_KEPT} generated ids")
    finish_reason: str | None = None
    text: str | None = Field(default=None, description="the start of the generated text")
    warning: str = Field(default="", description="a near-tie divergence or a comparison that was skipped")
    miss: bool = Field(
        default=False,
        description="failed only by being slow or unreachable (timeout, transport error, HTTP 5xx/429)",
    )


class SmokeReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    passed: bool
    diagnosis: str
    cases: list[CaseResult]
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class SmokeRequest:
    """One request to send: where, what, and what the answer must satisfy beyond the common rules."""

    name: str
    kind: str
    endpoint: Endpoint
    body: dict[str, Any]
    expect_substring: str | None = None
    min_prompt_tokens: int | None = None
    group: str | None = None  # the requests of one consistency case share a group
    compare_to: str | None = None
    concurrent: bool = False
    check_logprobs: bool = False
    expect_ids: tuple[int, ...] | None = None
    """A known answer: the first generated ids, exactly."""

    @property
    def model(self) -> str:
        return str(self.body["model"])


@dataclass
class Exchange:
    """What came back for one request, before judging it."""

    status_code: int | None = None
    body: Any = None
    raw_text: str = ""
    latency_s: float = 0.0
    timed_out: bool = False
    transport_error: str | None = None
    timeout_s: float | None = None
    too_big: str | None = None
    """The answer was over its size cap (`http_bounded`): why it was not read to the end."""


# --- the answer, validated before it is judged or stored ------------------------------------------------
#
# An OpenAI-shaped answer from vLLM, or from whatever stands where vLLM should: every field the rules read
# is checked for its type here (strict: no bool for an int, no float or numeric string for a token id, no
# list for a text), so the judge reads only well-formed values and a malformed answer is one `wrong` line,
# never a traceback. Fields the rules do not read are ignored.

NON_FINITE_WORDS = frozenset({"NaN", "nan", "Infinity", "-Infinity", "inf", "-inf"})


def _logprob_value(value: Any) -> Any:
    """NaN sent as the string "NaN" (a proxy re-encoding vLLM's answer) is NaN, for the NaN rule to see."""
    if isinstance(value, str) and value in NON_FINITE_WORDS:
        return float(value)
    return value


Logprob = Annotated[float | None, BeforeValidator(_logprob_value)]
TokenId = int
Count = Annotated[int, Field(ge=0, lt=2**31)]
"""A token count: no prompt or answer vLLM serves has 2**31 tokens."""


class _Strict(BaseModel):
    # Built at the first answer, not at import: the store imports this module for `CaseResult`.
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, defer_build=True)


class AnswerUsage(_Strict):
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None


class CompletionLogprobs(_Strict):
    token_logprobs: list[Logprob] | None = None
    top_logprobs: list[dict[str, Logprob] | None] | None = None


class CompletionChoice(_Strict):
    text: str | None = None
    token_ids: list[TokenId] | None = None
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None


class CompletionAnswer(_Strict):
    choices: list[CompletionChoice] = Field(min_length=1)
    usage: AnswerUsage | None = None


class ChatTopLogprob(_Strict):
    logprob: Logprob = None


class ChatTokenLogprob(_Strict):
    logprob: Logprob = None
    top_logprobs: list[ChatTopLogprob] | None = None


class ChatLogprobs(_Strict):
    content: list[ChatTokenLogprob] | None = None


class ChatMessage(_Strict):
    content: str | None = None


class ChatChoice(_Strict):
    message: ChatMessage | None = None
    token_ids: list[TokenId] | None = None
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatAnswer(_Strict):
    choices: list[ChatChoice] = Field(min_length=1)
    usage: AnswerUsage | None = None
