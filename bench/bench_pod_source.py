"""The pod copies of deploykit's modules (render/pod_source.py, run by every `render helm`) against the same
blanking done with Python's tokenizer, the way it was made before session 11, measured in the same run.

Prints CPU seconds per pass over the package and the ratio; writes its section of docs/benchmarks.md.
"""

from __future__ import annotations

import io
import sys
import time
import tokenize
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.benchmarks_doc import DOCS, write_section  # noqa: E402
from deploykit.paths import PACKAGE_DIR  # noqa: E402
from deploykit.render.plugin_wheel import build_plugin_wheel  # noqa: E402
from deploykit.render.pod_source import pod_source  # noqa: E402

REPEATS = 5


def tokenizer_comments_blanked(source: bytes) -> bytes:
    """The baseline: the comments Python's tokenizer finds, blanked as pod_source blanks them."""
    text = source.decode("utf-8")
    lines = text.splitlines(keepends=True)
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            row, column = token.start
            line = lines[row - 1]
            lines[row - 1] = line[:column].rstrip() + line[len(line.rstrip("\r\n")) :]
    return "".join(lines).encode("utf-8")


def best_cpu_s(work: Callable[[bytes], bytes], sources: list[bytes]) -> float:
    timings = []
    for _ in range(REPEATS):
        started = time.process_time()
        for source in sources:
            work(source)
        timings.append(time.process_time() - started)
    return min(timings)


def main() -> None:
    modules = sorted(p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts)
    sources = [path.read_bytes() for path in modules]
    regex_s = best_cpu_s(pod_source, sources)
    tokenizer_s = best_cpu_s(tokenizer_comments_blanked, sources)
    build_plugin_wheel()
    wheel = []
    for _ in range(REPEATS):
        started = time.process_time()
        build_plugin_wheel()
        wheel.append(time.process_time() - started)
    body = (
        f"{len(modules)} modules ({sum(map(len, sources)) / 1024:.0f} KiB), best of {REPEATS} passes, "
        "CPU time:\n\n"
        "| what | CPU s per pass | vs the tokenizer |\n|---|---|---|\n"
        f"| Python's tokenizer, comments only (the way before session 11) | {tokenizer_s:.3f} | 1.00 |\n"
        "| `pod_source` (one regular expression; comments and every docstring: module, class, function) | "
        f"{regex_s:.3f} | "
        f"{regex_s / tokenizer_s:.2f} |\n"
        f"| the whole plugin wheel (`build_plugin_wheel`, every `render helm`) | {min(wheel):.3f} | |\n"
    )
    print(body)
    write_section(DOCS, "pod-source", "Pod copies of the modules (bench/bench_pod_source.py)", body)


if __name__ == "__main__":
    main()
