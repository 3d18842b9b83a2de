"""Known-bad combinations from the field, as data (catalog.yaml, and each registered fix's ADVISORY): which
apply to a deployment, and the workaround the plan applies or prints. `deploykit advisories` lists them;
docs/advisories.md."""

from deploykit.advisories.catalog import advisories, advisory_ids
from deploykit.advisories.compute_dtype import ComputeDtype, quantization_method, resolve_compute_dtype
from deploykit.advisories.evaluate import (
    Advice,
    AdvisoryOutcome,
    FixCall,
    Verdict,
    advise,
    judge_all,
    mode_errors,
)
from deploykit.advisories.facts import DeploymentFacts, deployment_facts, machine_facts

__all__ = [
    "Advice",
    "AdvisoryOutcome",
    "ComputeDtype",
    "DeploymentFacts",
    "FixCall",
    "Verdict",
    "advise",
    "advisories",
    "advisory_ids",
    "deployment_facts",
    "judge_all",
    "machine_facts",
    "mode_errors",
    "quantization_method",
    "resolve_compute_dtype",
]
