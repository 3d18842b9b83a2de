"""The cases a canary cycles through, each cheap: it runs forever, next to user traffic.

A run checks one case of the rotation: the profile's smoke cases (its known answers among them, each with
the tokens its answer needs) plus every consistency kind, with a few tokens, a small batch and a long prompt
of at most `CANARY_LONG_PROMPT_TOKENS`. Each run's long prompts are salted by its number, so that a run is a
real long forward pass, not a prefix-cache hit on the previous run's prompt.

Why the long prompt is bounded, and by 512: what the long cases detect needs a length, not the context.
`long_then_short` looks for a long prompt that leaves state behind which breaks the short prompts after it
(field report 003: prompts over about 400 tokens, then every request broken until restart);
`prefix_cache` needs a prompt that fills at least one KV block, so its repeat is served from the cache
(16 tokens a block on vLLM's GPU default, 128 on the CPU build). 512 tokens is over both, whatever
`max_model_len` is; a profile that asks for a longer one (`prompt_tokens`) gets it in the start-up smoke,
once per start, not in a rotation that runs every minute for as long as the server serves
(docs/serve.md, "The canary's cost").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deploykit.profile.schema import Profile, SmokeCase
    from deploykit.smoke import SmokeRequest

CANARY_MAX_TOKENS = 8
CANARY_BATCH_SIZE = 4
CANARY_LONG_PROMPT_TOKENS = 512
"""The longest token-id prompt a rotation sends (`long_then_short`, `prefix_cache`); why: the module doc."""
LONG_KINDS = ("long_then_short", "prefix_cache")


def rotation_for(profile: Profile | None) -> list[SmokeCase]:
    """The profile's smoke cases plus every consistency kind, each cheap (few tokens, a small batch, a long
    prompt of at most CANARY_LONG_PROMPT_TOKENS)."""
    from deploykit.profile.schema import CONSISTENCY_KINDS, SmokeCase
    from deploykit.smoke import derive_cases

    # Without a profile: only what any completions model can answer.
    base = derive_cases(profile) if profile is not None else [SmokeCase(kind="completion")]
    kinds = {case.kind for case in base}
    base += [SmokeCase(kind=kind) for kind in CONSISTENCY_KINDS if kind not in kinds]
    cheap = []
    for case in base:
        update: dict[str, Any] = {}
        if case.expect_substring is None and case.expect_ids is None:  # a known answer needs its tokens
            update["max_tokens"] = min(case.max_tokens, CANARY_MAX_TOKENS)
        if case.kind == "batch":
            update["batch_size"] = min(case.batch_size, CANARY_BATCH_SIZE)
        if case.kind in LONG_KINDS and case.prompt_tokens is not None:
            update["prompt_tokens"] = min(case.prompt_tokens, CANARY_LONG_PROMPT_TOKENS)
        cheap.append(case.model_copy(update=update))
    return cheap


def case_labels(cases: Sequence[SmokeCase]) -> list[str]:
    """A name per case for metrics and lines: its kind, numbered from the second of a kind on."""
    seen: dict[str, int] = {}
    labels = []
    for case in cases:
        if case.name is not None:  # a known answer: its own name
            labels.append(case.name)
            continue
        seen[case.kind] = seen.get(case.kind, 0) + 1
        labels.append(case.kind if seen[case.kind] == 1 else f"{case.kind}#{seen[case.kind]}")
    return labels


def run_requests(
    cases: Sequence[SmokeCase],
    number: int,
    served_name: str,
    adapter: str | None,
    max_model_len: int | None,
) -> list[SmokeRequest]:
    """Run `number`'s requests (from 0): the rotation's next case, its long prompts salted by `number`."""
    from deploykit.smoke import smoke_requests

    case = cases[number % len(cases)]
    return smoke_requests([case], served_name, adapter, max_model_len=max_model_len, salt=number * 7 + 1)
