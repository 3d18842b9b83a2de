"""The record is the results' floor: building rows needs no store (the vLLM image's sidecars have none)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from tests.vllm_harness import REPO

_IMPORT_THE_RECORD = """
import json, sys
from deploykit.results.record import ResultRecord
ResultRecord(command="smoke", verdict="pass", stage="done")
print(json.dumps(sorted(sys.modules)))
"""


def test_importing_the_record_imports_no_store_and_no_sqlalchemy() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_THE_RECORD], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert "deploykit.results.record" in loaded  # the probe itself worked
    persistence = [
        name
        for name in loaded
        if name.split(".")[0] == "sqlalchemy"
        or name.startswith(("deploykit.results.sql", "deploykit.results.spool", "deploykit.results.store"))
    ]
    assert persistence == []


def test_a_fingerprint_key_that_is_not_a_key_is_refused_at_the_record() -> None:
    """A key is the hex digest `key_digest` makes: anything else (a forged spool file's) never reaches the
    store, where PostgreSQL's lock reads it as hex (a ValueError there today)."""
    from deploykit.results.record import ResultRecord
    from deploykit.smoke.fingerprint import Fingerprint, ProbeAnswer

    answers = [ProbeAnswer(prompt="p", ids=[5])]
    ResultRecord(
        verdict="pass", stage="done", fingerprint=Fingerprint(dtype="float32", key="ab12", answers=answers)
    )
    for key in ("not-hex", "", "AB12", "a" * 65, "ab\n12"):
        with pytest.raises(ValidationError, match="fingerprint"):
            ResultRecord(
                verdict="pass",
                stage="done",
                fingerprint=Fingerprint(dtype="float32", key=key, answers=answers),
            )
