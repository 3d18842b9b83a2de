"""Shared fixtures, and the test tiers.

Fixtures: tiny models are built once per machine (cached); each real vLLM server is shared by the tests of
a session, because a start costs 20–60 s on a 2-core machine.

Tiers: a test that needs a vLLM server, imports vLLM (or torch), builds a wheel, or runs podman,
systemd-nspawn or helm carries a marker for it (pyproject.toml lists them). `pytest --fast` (`make check`)
runs every other test; plain `pytest` (`make test`) runs them all. The markers are applied here wherever a
test's place or fixtures tell, so a new test is classified without its author knowing; a module marks the
rest itself. Under --fast the tier also guards itself: a test that imports vLLM or starts one of those
tools without its marker fails and names the marker, and collecting must not import vLLM or torch.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import functools
import inspect
import json
import os
import subprocess
import sys
import textwrap
import traceback
from collections.abc import Iterator, Sequence
from importlib.abc import MetaPathFinder
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import pytest

from tests.vllm_harness import REPO, RunningServer, running_vllm, tiny_serve_args

os.environ.setdefault("DEPLOYKIT_MODEL_CACHE", str(REPO / ".deploykit-cache" / "models"))
# vLLM option tables (deploykit.vllm_options): built once per vLLM version, kept out of the user cache.
os.environ.setdefault("DEPLOYKIT_CACHE_DIR", str(REPO / ".deploykit-cache"))


@pytest.fixture(autouse=True)
def _own_spool(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows spooled for an unreachable store (deploykit.results.spool) go to the test's own directory, never
    the user's data directory (subprocesses inherit it)."""
    monkeypatch.setenv("DEPLOYKIT_SPOOL_DIR", str(tmp_path_factory.mktemp("spool")))


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from deploykit.tinymodel import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="session")
def tiny_vllm(tiny_model_dir: Path) -> Iterator[RunningServer]:
    """One plain vLLM serving the tiny model, without any deploykit fix."""
    with running_vllm(tiny_serve_args(tiny_model_dir)) as server:
        yield server


# --- the tiers ------------------------------------------------------------------------------------------

SLOW_MARKERS = ("vllm_server", "vllm_import", "wheel_build", "external_tool")
# A test that uses one of these fixtures needs what the marker names.
FIXTURE_MARKERS: dict[str, str] = {
    "tiny_vllm": "vllm_server",
    "tiny_model_dir": "vllm_import",  # builds the tiny checkpoint with torch when the cache is cold
    "real_model_server": "vllm_server",  # tests/e2e/real_model.py
    "charts": "external_tool",  # rendered Helm charts, linted and templated by helm
    "platform_docs": "external_tool",
    "target_install": "wheel_build",
    "pod_runtime": "external_tool",
    "pod_base_image": "external_tool",
    "nspawn_machine": "external_tool",
}
HEAVY_MODULES = ("vllm", "torch")
TOOL_MARKERS = {"helm": "external_tool", "podman": "external_tool", "systemd-nspawn": "external_tool"}
PIP_BUILDS = {"wheel", "install", "download"}
SETUP_BUILDS = {"sdist", "bdist_wheel", "bdist", "install"}
# Longer than this in the fast tier is worth a look (the whole tier should stay under 60 s on 2 cores).
SLOW_IN_FAST_TIER_S = 5.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="the fast tier (`make check`): leave out tests marked " + ", ".join(SLOW_MARKERS),
    )
    parser.addoption(
        "--slow",
        action="store_true",
        help="everything --fast leaves out (`make test` runs the fast tier on every core, then this)",
    )


def is_e2e_path(path: Path) -> bool:
    """tests/e2e/ and any `*_e2e.py`: real vLLM starts."""
    inside = path.relative_to(REPO).parts[:2] if path.is_relative_to(REPO) else ()
    return "e2e" in inside or path.name.endswith("_e2e.py")


def markers_for(item: pytest.Item) -> set[str]:
    """What a test's place, markers, module imports and fixtures say it needs."""
    needed = {FIXTURE_MARKERS[name] for name in getattr(item, "fixturenames", ()) if name in FIXTURE_MARKERS}
    if is_e2e_path(item.path) or item.get_closest_marker("e2e") is not None:
        needed.add("vllm_server")
    if item.path.suffix == ".py" and heavy_at_import(item.path):
        needed.add("vllm_import")
    if any(_imports_heavy(function) for function in _functions_run(item)):
        needed.add("vllm_import")
    return needed


def _functions_run(item: pytest.Item) -> list[Any]:
    """The test function and the functions of every fixture it uses."""
    functions = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        functions += [definition.func for definition in (info.name2fixturedefs.get(name, ()) if info else ())]
    return [f for f in functions if f is not None]


def _imports_heavy(function: Any) -> bool:
    """An `import torch` / `from vllm ...` anywhere in the function's own source (decorators and nested
    functions included). Read from its file's syntax tree (source_facts): inspect.getsource per function
    cost a second of every worker's collection."""
    code = getattr(inspect.unwrap(function), "__code__", None)
    if code is not None:
        by_line = source_facts(code.co_filename).heavy_functions
        if code.co_firstlineno in by_line:
            return by_line[code.co_firstlineno]
    return _imports_heavy_by_source(function)


@functools.cache
def _imports_heavy_by_source(function: Any) -> bool:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return False
    return any(_heavy_import(node) for node in ast.walk(tree))


def _heavy_import(node: ast.AST) -> bool:
    return any(name.partition(".")[0] in HEAVY_MODULES for name in _imported_names(node, with_members=False))


def _imported_names(node: ast.AST, *, with_members: bool) -> list[str]:
    """The modules an import statement names (absolute imports only); `from a import b` gives a.b too
    when with_members (b may be a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0:
        module = node.module or ""
        return [module, *(f"{module}.{alias.name}" for alias in node.names)] if with_members else [module]
    return []


@functools.cache
def heavy_at_import(path: Path) -> str:
    """Why importing a test module imports vLLM or torch ("" when it does not), read from its source
    without importing it: a module-level import or `importorskip` of either, or of a tests/ helper that
    does, or a module-level `pytestmark` naming a slow marker."""
    for kind, names in source_facts(str(path)).at_import:
        if kind == "marks":
            return f"{path.name}: pytestmark {', '.join(names)}"
        for name in names:
            if name.partition(".")[0] in HEAVY_MODULES:
                return f"{path.name} imports {name}"
            helper = _test_helper_file(name)
            if helper is not None and helper != path and heavy_at_import(helper):
                return f"{path.name} imports {name}: {heavy_at_import(helper)}"
    return ""


class SourceFacts(NamedTuple):
    """What the tier guard reads in a file. at_import: in order, ("names", modules a module-level import
    or importorskip names) and ("marks", slow markers a module-level pytestmark names). heavy_functions:
    for each function, keyed by the line its code starts on (its first decorator's, else its `def`'s),
    whether its source imports vLLM or torch."""

    at_import: list[tuple[str, list[str]]]
    heavy_functions: dict[int, bool]


_FACTS_CACHE = REPO / ".deploykit-cache" / "tier-guard.json"
_facts_on_disk: dict[str, Any] | None = None
_facts_changed = False


@functools.cache
def source_facts(filename: str) -> SourceFacts:
    """One parse of a file per change, kept in .deploykit-cache/tier-guard.json (by size and mtime) for the
    next process: every xdist worker collects the whole tier, and parsing ~120 files twice cost each ~0.8 s.
    """
    global _facts_on_disk, _facts_changed
    path = Path(filename)
    try:
        stat = path.stat()
    except OSError:
        return SourceFacts([], {})
    key = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else None
    stamp = [stat.st_mtime_ns, stat.st_size]
    if key is not None:
        if _facts_on_disk is None:
            _facts_on_disk = _read_facts_cache()
        known = _facts_on_disk.get(key)
        if known is not None and known.get("stamp") == stamp:
            return SourceFacts(
                [(kind, list(names)) for kind, names in known["at_import"]],
                {int(line): heavy for line, heavy in known["heavy_functions"].items()},
            )
    facts = _read_source_facts(path)
    if key is not None and _facts_on_disk is not None:
        _facts_on_disk[key] = {
            "stamp": stamp,
            "at_import": facts.at_import,
            "heavy_functions": facts.heavy_functions,
        }
        _facts_changed = True
    return facts


def _read_facts_cache() -> dict[str, Any]:
    try:
        loaded = json.loads(_FACTS_CACHE.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) and loaded.get("version") == 1 else {}


def save_source_facts() -> None:
    """Written whole and renamed into place: workers that save at once leave one complete file."""
    global _facts_changed
    if not _facts_changed or _facts_on_disk is None:
        return
    _facts_on_disk["version"] = 1
    with contextlib.suppress(OSError):
        _FACTS_CACHE.parent.mkdir(parents=True, exist_ok=True)
        partial = _FACTS_CACHE.with_name(f"{_FACTS_CACHE.name}.{os.getpid()}")
        partial.write_text(json.dumps(_facts_on_disk))
        partial.replace(_FACTS_CACHE)
    _facts_changed = False


def _read_source_facts(path: Path) -> SourceFacts:
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return SourceFacts([], {})
    at_import: list[tuple[str, list[str]]] = []
    for node in _module_level(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "importorskip" and node.args:
            at_import.append(("names", [str(getattr(node.args[0], "value", ""))]))
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            marks = {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)} & set(SLOW_MARKERS)
            if marks:
                at_import.append(("marks", sorted(marks)))
        elif names := _imported_names(node, with_members=True):
            at_import.append(("names", names))
    heavy: dict[int, bool] = {}
    pending: list[tuple[ast.AST, tuple[int, ...]]] = [(tree, ())]
    while pending:  # one walk: a heavy import marks every function it sits in
        node, enclosing = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])
            heavy.setdefault(first, False)
            enclosing = (*enclosing, first)
        elif _heavy_import(node):
            heavy.update(dict.fromkeys(enclosing, True))
        pending.extend((child, enclosing) for child in ast.iter_child_nodes(node))
    return SourceFacts(at_import, heavy)


def _module_level(tree: ast.Module) -> Iterator[ast.AST]:
    """The nodes that run when the module is imported (function bodies do not)."""
    pending = collections.deque[ast.AST](tree.body)
    while pending:
        node = pending.popleft()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            pending.extend(ast.iter_child_nodes(node))


def _test_helper_file(module: str) -> Path | None:
    if module.partition(".")[0] != "tests":
        return None
    base = REPO.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def pytest_configure(config: pytest.Config) -> None:
    pin_vllm_to_this_workers_core()
    if config.getoption("--slow"):
        if config.getoption("--fast"):
            raise pytest.UsageError("--fast and --slow together select nothing")
        slow = " or ".join(SLOW_MARKERS)
        expression = config.option.markexpr
        config.option.markexpr = f"({expression}) and ({slow})" if expression else slow
    if config.getoption("--fast"):
        fast = "not (" + " or ".join(SLOW_MARKERS) + ")"
        expression = config.option.markexpr
        config.option.markexpr = f"({expression}) and {fast}" if expression else fast
        finder = _HeavyImportSpy()
        sys.meta_path.insert(0, finder)
        config.stash[_SPY] = finder


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`--fast -n auto`: two workers a core. Much of the fast tier waits rather than computes (a hostile
    server's deadline, a child process, a poll), and a second worker fills that time: 80 s instead of 112 s
    on this 2-core machine, idle (4 workers; 6 took 94 s, the tier's CPU then the limit). At most 16: each
    worker starts and collects the whole tier (~3–4 s of CPU) and holds a few hundred MB."""
    if config.getoption("--fast"):
        return min(2 * len(os.sched_getaffinity(0)), 16)
    return None


def pin_vllm_to_this_workers_core() -> None:
    """Each pytest-xdist worker's vLLM servers compute on a core of their own. vLLM's CPU build binds its
    worker to the last core of each physical core, leaving one core to everything else ("auto", reserving
    one): on two cores every server lands on core 0, so two workers' servers would share one core and leave
    the other idle, and a canary beside them would see a slowed engine. The servers' children inherit it
    (the harness and `deploykit serve` pass the environment on); a binding set by hand is kept."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return
    cores = sorted(os.sched_getaffinity(0))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(cores[int(worker[2:]) % len(cores)])


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """--fast does not even import the modules that would import torch or vLLM: e2e, and any whose
    source imports either at module level (or is marked slow as a whole)."""
    if not config.getoption("--fast"):
        return None
    if is_e2e_path(collection_path):
        return True
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return bool(heavy_at_import(collection_path)) or None
    return None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker in sorted(markers_for(item)):
            item.add_marker(marker)
        if BOOTED_SYSTEMS.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.runs_alone)


# A whole system booted in a container (systemd in nspawn, a pod in podman) with vLLM inside: its units'
# and probes' start-up bounds are the deployment's own, sized for a machine that is not also running another
# vLLM, so these run in `make test`'s last part, one at a time (marker runs_alone).
BOOTED_SYSTEMS = frozenset({"nspawn_machine", "pod_runtime"})


def pytest_collection_finish(session: pytest.Session) -> None:
    """--fast: collecting must not have imported vLLM or torch. The tests of the module that did (all
    tests, when it was no test module) fail with the reason: a failure, unlike a usage error, reaches
    the terminal from pytest-xdist's workers too."""
    save_source_facts()
    if not session.config.getoption("--fast"):
        return
    imported = heavy_imported()
    if imported:
        spy = session.config.stash[_SPY]
        culprit = spy.first.get(imported[0], "")
        where = f"by {culprit}" if culprit else "before collection began: tests/conftest.py's imports"
        message = (
            f"--fast: collecting the tests imported {', '.join(imported)} ({where}); import it inside "
            "the test and mark the test vllm_import"
        )
        if session.config.option.collectonly:  # no test runs to carry it
            raise pytest.UsageError(message)
        session.config.stash[_COLLECTION_FAILURE] = (Path(culprit) if culprit else None, message)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))


def _guarded(item: pytest.Item) -> Iterator[None]:
    """In the fast tier: no vLLM or torch import, no podman/nspawn/helm, no wheel build."""
    if not item.config.getoption("--fast"):
        return (yield)
    culprit, failure = item.config.stash.get(_COLLECTION_FAILURE, (None, ""))
    if failure and culprit in (None, item.path):
        pytest.fail(failure)
    before = set(heavy_imported())
    original = subprocess.Popen
    subprocess.Popen = _guarded_popen(original)  # type: ignore[misc,assignment]
    try:
        result = yield
    finally:
        subprocess.Popen = original  # type: ignore[misc]
    imported = [name for name in heavy_imported() if name not in before]
    if imported:
        pytest.fail(f"{item.nodeid} imports {', '.join(imported)}: mark it vllm_import (it is not --fast)")
    return result


def heavy_imported() -> list[str]:
    """vLLM and torch when really imported (a test's stand-in module in sys.modules has no file)."""
    return [name for name in HEAVY_MODULES if getattr(sys.modules.get(name), "__file__", None)]


def needed_for_argv(argv: Sequence[str]) -> tuple[str, str] | None:
    """(marker, what) when a command line runs an external tool or builds or installs a wheel."""
    names = [Path(str(arg)).name for arg in argv]
    if names and names[0] in TOOL_MARKERS:
        return TOOL_MARKERS[names[0]], names[0]
    if ("pip" in names or (names and names[0].startswith("pip"))) and PIP_BUILDS & set(names):
        return "wheel_build", "pip " + next(n for n in names if n in PIP_BUILDS)
    if "setup.py" in names and SETUP_BUILDS & set(names):
        return "wheel_build", "setup.py " + next(n for n in names if n in SETUP_BUILDS)
    return None


def _guarded_popen(original: type[subprocess.Popen[Any]]) -> type[subprocess.Popen[Any]]:
    class GuardedPopen(original):  # type: ignore[valid-type,misc]
        def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
            argv = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
            words = [os.fsdecode(a) if isinstance(a, str | bytes | os.PathLike) else str(a) for a in argv]
            if kwargs.get("shell") and isinstance(args, str):
                words = args.split()
            needed = needed_for_argv(words)
            if needed is not None:
                marker, what = needed
                self._child_created = False  # Popen.__del__ reads it; no child was started
                pytest.fail(f"this test runs {what}: mark it {marker} (it is not --fast)")
            super().__init__(args, *rest, **kwargs)

    return GuardedPopen


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """--fast: name the tests of the tier that took longest, so a slow newcomer is marked in time."""
    if not config.getoption("--fast"):
        return
    totals: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                totals[report.nodeid] = totals.get(report.nodeid, 0.0) + report.duration
    slow = sorted(((s, n) for n, s in totals.items() if s > SLOW_IN_FAST_TIER_S), reverse=True)
    if slow:
        terminalreporter.write_sep("-", f"fast-tier tests over {SLOW_IN_FAST_TIER_S:.0f} s (mark them?)")
        for seconds, nodeid in slow:
            terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")


class _HeavyImportSpy(MetaPathFinder):
    """Remembers which file first imported vLLM or torch, for the collection guard's message."""

    def __init__(self) -> None:
        self.first: dict[str, str] = {}

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
        top = fullname.partition(".")[0]
        if top in HEAVY_MODULES and top not in self.first:
            files = [frame.filename for frame in traceback.extract_stack()]
            ours = [f for f in files if f.startswith(str(REPO)) and "/.venv/" not in f and f != __file__]
            self.first[top] = ours[-1] if ours else ""
        return None


_SPY = pytest.StashKey[_HeavyImportSpy]()
_COLLECTION_FAILURE = pytest.StashKey[tuple[Path | None, str]]()
