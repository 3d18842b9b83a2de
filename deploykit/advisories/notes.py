"""Figures an advisory computes for one deployment, named by the catalog's `action.note`."""

from __future__ import annotations

from deploykit.advisories.facts import DeploymentFacts


def v2_penalty_table(facts: DeploymentFacts) -> str:
    """The V2 model runner's penalty state for this deployment, and what a smaller --max-num-seqs saves."""
    mib = facts.penalty_table_mib
    if mib is None or facts.max_num_seqs is None or facts.vocab_size is None:
        return (
            "the size needs --max-num-seqs and the model's vocab size (config.json): "
            "4 bytes per sequence per vocab entry"
        )
    quarter = max(facts.max_num_seqs // 4, 1)
    saved = mib - mib * quarter // facts.max_num_seqs
    return (
        f"the V2 model runner reserves {mib} MiB per GPU for penalty state (int32[{facts.max_num_seqs}, "
        f"{facts.vocab_size}] plus a bitmask) whether or not requests use penalties; "
        f"`--max-num-seqs {quarter}` would give back about {saved} MiB to the KV cache"
    )


NOTES = {"v2_penalty_table": v2_penalty_table}


def note_text(name: str, facts: DeploymentFacts) -> str:
    return NOTES[name](facts)
