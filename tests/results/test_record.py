"""The record is the results' floor: building rows needs no store (the vLLM image's sidecars have none)."""

from __future__ import annotations

import json
import subprocess
import sys

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
