"""The smoke: a deployment that answers HTTP 200 with no words is not healthy.

One module per job, so each rule can be tested without a server:
  `cases`        a profile's cases → exact request bodies (pure),
  `judge`        one answer → what is wrong with it, and the report over all cases (pure),
  `consistency`  two answers to one greedy request → where they part, a near tie or a real change (pure),
  `client`       the requests over HTTP, each answer judged (`run_smoke`),
  `fix_check`    the server's `/deploykit/status` against the plan's fixes, as one more case,
  `models`, `image`, `tokens`: the records (and the strict shape of an answer), the image case's PNG, a
  model's special token ids and vocabulary size.

Every request is one bounded read (`deploykit.http_bounded`: a whole-request deadline, a size cap). The
names below are the package's public surface; they are cheap to import, because the store reads
`CaseResult` from every row.
"""

from __future__ import annotations

from deploykit.smoke.cases import (
    CONSISTENCY_TOP_LOGPROBS,
    DEFAULT_PROMPTS,
    LONG_PROMPT_TOKENS,
    LORA_LONG_MIN_PROMPT_TOKENS,
    derive_cases,
    first_adapter,
    long_prompt,
    long_prompt_ids,
    long_prompt_tokens,
    requests_for_profile,
    smoke_requests,
)
from deploykit.smoke.client import batches, run_smoke, send
from deploykit.smoke.consistency import (
    DEFAULT_LOGPROB_TOLERANCE,
    DEFAULT_TIE_TOLERANCE,
    Divergence,
    Trace,
    compare_traces,
    judge_consistency,
    parse_trace,
    top2_gap,
)
from deploykit.smoke.image import smoke_image_data_url, smoke_image_png
from deploykit.smoke.judge import judge, summarise
from deploykit.smoke.models import FIRST_IDS_KEPT, CaseResult, Endpoint, Exchange, SmokeReport, SmokeRequest
from deploykit.smoke.tokens import special_token_ids, vocab_size

__all__ = [
    "CONSISTENCY_TOP_LOGPROBS",
    "DEFAULT_LOGPROB_TOLERANCE",
    "DEFAULT_PROMPTS",
    "DEFAULT_TIE_TOLERANCE",
    "FIRST_IDS_KEPT",
    "LONG_PROMPT_TOKENS",
    "LORA_LONG_MIN_PROMPT_TOKENS",
    "CaseResult",
    "Divergence",
    "Endpoint",
    "Exchange",
    "SmokeReport",
    "SmokeRequest",
    "Trace",
    "batches",
    "compare_traces",
    "derive_cases",
    "first_adapter",
    "judge",
    "judge_consistency",
    "long_prompt",
    "long_prompt_ids",
    "long_prompt_tokens",
    "parse_trace",
    "requests_for_profile",
    "run_smoke",
    "send",
    "smoke_image_data_url",
    "smoke_image_png",
    "smoke_requests",
    "special_token_ids",
    "summarise",
    "top2_gap",
    "vocab_size",
]
