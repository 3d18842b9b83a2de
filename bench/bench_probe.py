"""Wall time of `deploykit probe --format json` and `deploykit plan --profile demo-cpu` (with its default
argv validation, cache warm, and with --no-validate), interpreter start included, against `python -c pass`
measured in the same run.

The commands run round-robin (so a busy neighbour slows all of them alike) and each figure is the
median of the repetitions, beside the best one. Targets: under 0.3 s for the probe (issue 2), under 0.5 s
best-of-N for a warm validated `plan` (issue 11). CPU
time (user + system of the child) is printed beside wall time: on a shared 2-core box wall time
mostly measures the neighbours, CPU time is what the command itself costs.
With --imports it also lists which imports dominate (from `python -X importtime`).

    .venv/bin/python bench/bench_probe.py [--reps 15] [--imports] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.benchmarks_doc import write_section  # noqa: E402

BIN = Path(sys.executable).parent
TARGET_S = 0.3
TITLE = "`deploykit probe` / `plan` start-up (bench/bench_probe.py)"

COMMANDS: dict[str, list[str]] = {
    "python -c pass (baseline)": [sys.executable, "-c", "pass"],
    "python -c 'import deploykit.cli'": [sys.executable, "-c", "import deploykit.cli"],
    "read_probe_document() (the JSON path, no CLI)": [
        sys.executable,
        "-c",
        "import sys; from deploykit.probe.nvml_reader import document_json, read_probe_document; "
        "sys.stdout.write(document_json(read_probe_document()))",
    ],
    "probe() (validated ProbeFacts, no CLI)": [
        sys.executable,
        "-c",
        "import sys; from deploykit.probe.load import probe; sys.stdout.write(probe().model_dump_json())",
    ],
    "deploykit probe --format json": [str(BIN / "deploykit"), "probe", "--format", "json"],
    "deploykit probe (table)": [str(BIN / "deploykit"), "probe"],
    "floor of any pydantic command: typer + pydantic's first model": [
        sys.executable,
        "-c",
        "import typer, pydantic\nclass M(pydantic.BaseModel):\n    x: int\nM(x=1).model_dump_json()",
    ],
    "deploykit plan --profile demo-cpu --no-validate": [
        str(BIN / "deploykit"),
        "plan",
        "--profile",
        "demo-cpu",
        "--no-validate",
    ],
    "deploykit plan --profile demo-cpu (validated, option table cached)": [
        str(BIN / "deploykit"),
        "plan",
        "--profile",
        "demo-cpu",
    ],
}
PLAN = "deploykit plan --profile demo-cpu (validated, option table cached)"
PLAN_TARGET_S = 0.5
BASELINE = "python -c pass (baseline)"

# What profiling (`python -X importtime`, cProfile) showed; kept with the numbers in the docs.
NOTES = """Where the time goes (python -X importtime and cProfile of `deploykit probe --format json`):

- pydantic: importing it and building the first model costs ~0.25 s here, half of it in imports
  pydantic makes lazily at the first model and in its plugin loader (`importlib.metadata` plus a scan
  of the entry points of every installed distribution, 173 in this venv). The JSON path therefore
  builds the document with plain dicts (`deploykit.probe.nvml_reader`) and prints it with `json`; tests hold
  it to the bytes `ProbeFacts.model_dump_json(indent=2)` writes for every GPU fixture and NVML failure
  (tests/probe/test_nvml_reader.py) and check that the command imports neither pydantic, importlib.metadata
  nor rich (tests/cli/test_imports.py). The table for people still validates with pydantic.
- Package versions (vllm, torch) are read from their METADATA files (`deploykit.installed`), not with
  `importlib.metadata` (~0.07 s to import); tests compare both over every installed distribution.
- typer 0.29 coerced every CLI parameter through pydantic `TypeAdapter`s (about 0.3 s CPU per
  command); pyproject.toml pins typer below 0.29. typer itself is now the largest import (~0.05 s).
- `pynvml` (an 8000-line module of ctypes structures, ~0.02 s) and `site` (the editable-install finder).
- torch and vLLM: never imported (tests/cli/test_imports.py), validated `plan` included: the argv is
  checked against the installed vLLM's `vllm serve` option table, read once per vLLM version in a child
  process and cached (deploykit.vllm_options); the check rebuilds the parser from it (~0.03 s CPU).
  Before, validation imported vLLM into the CLI: 7.3 s on an idle machine.
- `plan` (target 0.3 s, issue 3) reads a YAML profile into pydantic models, the boundary the house
  style requires, so it cannot go below the "floor" row: the interpreter, typer and pydantic's first
  model, which already exceeds 0.3 s here. The rest is PyYAML, ~20 more models, and rich for the text
  report.

The machine is shared (the load average above counts other work on 2 cores), so
wall times are several times the CPU times; compare ratios within one run."""


def time_once(argv: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of one run of the command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(reps: int) -> dict[str, list[tuple[float, float]]]:
    for argv in COMMANDS.values():  # warm the file cache and .pyc files once
        time_once(argv)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in COMMANDS}
    for _ in range(reps):
        for name, argv in COMMANDS.items():
            samples[name].append(time_once(argv))
    return samples


def import_breakdown(argv: list[str], top: int = 12) -> list[tuple[str, float]]:
    """Top-level imports by cumulative time (seconds), as `python -X importtime` reports them."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, cwd=REPO, check=False
    )
    rows: list[tuple[str, float]] = []
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        if not name.startswith("  "):  # only imports made by the program itself, not nested ones
            rows.append((name.strip(), int(cumulative) / 1e6))
    return sorted(rows, key=lambda row: row[1], reverse=True)[:top]


def report(samples: dict[str, list[tuple[float, float]]], reps: int) -> str:
    load_before = os.getloadavg()[0]
    walls = {name: [wall for wall, _ in values] for name, values in samples.items()}
    cpus = {name: [cpu for _, cpu in values] for name, values in samples.items()}
    base_wall, base_cpu = statistics.median(walls[BASELINE]), statistics.median(cpus[BASELINE])
    lines = [
        f"{reps} repetitions each, round-robin, medians, interpreter start included; "
        f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"1-min load average {load_before:.2f} at the end of the run.",
        "",
        "| command | wall s | best wall s | × baseline (wall) | CPU s | best CPU s | × baseline (CPU) "
        "| CPU over baseline s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in samples:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        lines.append(
            f"| `{name}` | {wall:.3f} | {min(walls[name]):.3f} | {wall / base_wall:.1f} | {cpu:.3f} "
            f"| {min(cpus[name]):.3f} | {cpu / base_cpu:.1f} | {cpu - base_cpu:+.3f} |"
        )
    probe_wall = statistics.median(walls["deploykit probe --format json"])
    probe_cpu = statistics.median(cpus["deploykit probe --format json"])
    verdict = "meets" if probe_wall < TARGET_S else "misses"
    lines += [
        "",
        f"Probe: wall {probe_wall:.3f} s, CPU {probe_cpu:.3f} s: {verdict} the {TARGET_S} s wall target.",
        f"Validated plan, best of {reps}: wall {min(walls[PLAN]):.3f} s, CPU {min(cpus[PLAN]):.3f} s "
        f"(target {PLAN_TARGET_S} s: {'met' if min(walls[PLAN]) < PLAN_TARGET_S else 'missed'} in wall time, "
        f"{'met' if min(cpus[PLAN]) < PLAN_TARGET_S else 'missed'} in CPU time).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--imports", action="store_true", help="also show which imports dominate")
    parser.add_argument("--write", type=Path, help="write the result as this benchmark's section here")
    args = parser.parse_args()

    body = report(measure(args.reps), args.reps)
    if args.imports:
        for name in ("deploykit probe --format json", PLAN):
            rows = import_breakdown([str(BIN / "deploykit"), *COMMANDS[name][1:]])
            body += f"\n\nTop-level imports of `{name}` (cumulative s, one run):\n\n"
            body += "\n".join(f"- `{module}` {seconds:.3f}" for module, seconds in rows)
    body += "\n\n" + NOTES
    print(body)
    if args.write:
        write_section(args.write, "bench_probe", TITLE, body)
        print(f"\nwrote the section into {args.write}")


if __name__ == "__main__":
    main()
