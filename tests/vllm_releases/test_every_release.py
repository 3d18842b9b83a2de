"""The tier "every supported release": the checks that need no compiled kernel, run against the Python
sources of each supported vLLM release other than the installed one.

Each such release runs in a child pytest whose `import vllm` gives that release (its PyPI wheel's Python
sources, fetched and checksum-checked by tools/fetch-vllm-sources.sh, first on PYTHONPATH, with vLLM's CPU
platform over the CPU build's torch). The compiled CUDA extensions of the wheel are left out on purpose:
a test that reached one would fail on the import, not pass on something this machine cannot run. The
child runs, for that release, the modules tools/vllm_tier.py lists (`make vllm-release` runs the same child):
- this folder's test_release_checks.py (fix targets, decision rules, status route, shipped facts);
- tests/test_vllm_options.py (the shipped option table against the release's live parser, 77 argvs and
  every boolean spelling);
- the module-level fix tests (tests/fixes): real vLLM layers and punica's torch path, no server.
The installed release (0.32) runs the same modules in the main run.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from deploykit.vllm_tables import SUPPORTED_VLLM_RELEASES
from tests.vllm_releases.releases import REPO, importable_release, in_child
from tools import vllm_tier

pytestmark = pytest.mark.vllm_import

OTHER_RELEASES = [r for r in SUPPORTED_VLLM_RELEASES if r != importable_release()]
CHILD_TIMEOUT_S = 1800  # ~4 min on an idle 2-core machine; the whole suite's other work shares it


@pytest.mark.skipif(in_child(), reason="a child run checks only its own release")
@pytest.mark.parametrize("release", OTHER_RELEASES)
def test_the_release_passes_the_source_level_checks(release: str) -> None:
    try:
        env = vllm_tier.child_env(release)
    except RuntimeError as exc:  # the sources could not be fetched (offline) or unpacked
        if os.environ.get("CI"):
            raise
        pytest.skip(f"vLLM {release}'s sources are not available here: {exc}")
    done = subprocess.run(
        vllm_tier.child_argv("-x"),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    tail = "\n".join(done.stdout.splitlines()[-40:])
    assert done.returncode == 0, f"vLLM {release}: the child run failed\n{tail}\n{done.stderr[-2000:]}"
    summary = done.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) > 150, summary  # the modules ran, not only their skips
    assert "failed" not in summary and "error" not in summary, summary
