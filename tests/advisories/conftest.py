"""Plans for test profiles against saved probe facts of real GPU models (tests/fixtures/facts)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploykit.plan import Plan, make_plan
from deploykit.probe.load import load_facts
from deploykit.profile.load import load_profile

FACTS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
# Hosts the NVML probe cannot see (ROCm, XPU) and facts with a stated FlashInfer, written by hand.
HAND_FACTS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "hand-facts"


def facts_path(name: str) -> Path:
    recorded = FACTS_DIR / f"{name}.json"
    return recorded if recorded.exists() else HAND_FACTS_DIR / f"{name}.json"


PlanFor = Callable[..., Plan]


@pytest.fixture
def plan_for(tmp_path: Path) -> PlanFor:
    """plan_for(facts, profile_dict, config=None): the plan `deploykit plan` makes (not validated). With
    `config`, the model is a local directory holding that config.json (vocab size, quantization)."""

    def make(facts: str, profile: dict[str, Any], config: dict[str, Any] | None = None) -> Plan:
        data = json.loads(json.dumps(profile))
        data.setdefault("name", "advisory-test")
        if config is not None:
            model_dir = tmp_path / "model"
            model_dir.mkdir(exist_ok=True)
            (model_dir / "config.json").write_text(json.dumps(config))
            data["model"]["source"] = str(model_dir)
        path = tmp_path / f"{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data))
        return make_plan(load_profile(str(path)), load_facts(str(facts_path(facts))))

    return make
