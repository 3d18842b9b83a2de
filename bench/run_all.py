"""Run every benchmark in bench/ one after another and print their reports (`make bench`).

Each script measures its own baseline in the same run and prints ratios; none of them is a test.
The serving benchmarks start real vLLM servers and take several minutes each.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SCRIPTS = [
    "bench_probe.py",
    "bench_pod_source.py",
    "bench_fp32_projection.py",
    "bench_matmul_lora.py",
    "bench_penalties.py",
    "bench_serve_overhead.py",
    "bench_penalties_serving.py",
    "bench_canary.py",
    "bench_fingerprint.py",
]


def main() -> int:
    failed = []
    for script in SCRIPTS:
        print(f"\n=== {script} ===", flush=True)
        if subprocess.run([sys.executable, str(BENCH / script)], check=False).returncode != 0:
            failed.append(script)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
