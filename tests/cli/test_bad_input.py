"""Every command against bad input, as a person runs it (`python -m deploykit ...`, in a process forked from
a warm interpreter: tests/cli_process.py): a non-zero exit, no traceback, and a message that names the input
(the file, URL, flag or value). Nothing here starts vLLM: each bad input is refused before a launch."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli_process import run_deploykit
from tests.unit_prefix import ABSENT_PREFIX
from tests.vllm_harness import REPO

FACTS = REPO / "tests" / "fixtures" / "facts"
UNWRITABLE = "/proc/deploykit-nowhere/results.sqlite"  # /proc takes no new directories, even for root
SECRET = "S3cret"  # in store URLs below: never printed
HANG_LIMIT_S = 5.0  # interpreter start included (~0.6 s here); the inputs below hung > 120 s before
BASE_PROFILE = "name: hostile\nplatform: cpu\nmodel: {source: /m}\n"


def billion_laughs(levels: int = 9) -> str:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for index in range(1, levels):
        name, previous = chr(ord("a") + index), chr(ord("a") + index - 1)
        lines.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad-input")
    files = {
        "binary_profile": root / "binary.yaml",
        "binary_facts": root / "binary.json",
        "future_facts": root / "future.json",
        "not_a_db": root / "notes.sqlite",
        "a_file": root / "a-file",
        "secret_profile": root / "secret.yaml",
        "token_profile": root / "token.yaml",
        "open_profile": root / "open.yaml",
        "open_cpu_profile": root / "open-cpu.yaml",
        "no_psycopg": root / "no-psycopg",
        "store": root / "results.sqlite",
        "profiles": root / "profiles",
        "bomb_profile": root / "bomb.yaml",
        "deep_profile": root / "deep.yaml",
        "fifo": root / "fifo.yaml",
        "deep_facts": root / "deep.json",
        "list_facts": root / "list.json",
        "null_facts": root / "null.json",
        "string_version_facts": root / "string-version.json",
        "banana_facts": root / "banana.json",
        "true_length_profile": root / "true-length.yaml",
        "unquoted_off_profile": root / "unquoted-off.yaml",
    }
    files["bomb_profile"].write_text(billion_laughs())
    files["deep_profile"].write_text(BASE_PROFILE + "serve: " + "[" * 20_000 + "]" * 20_000 + "\n")
    os.mkfifo(files["fifo"])
    files["deep_facts"].write_text('{"schema_version": 1, "gpus": ' + "[" * 100_000 + "]" * 100_000 + "}")
    files["list_facts"].write_text("[]\n")
    files["null_facts"].write_text("null\n")
    files["string_version_facts"].write_text('{"schema_version": "1", "gpus": []}\n')
    banana = json.loads((FACTS / "t4.json").read_text())
    banana["gpus"][0]["compute_capability"] = "banana"
    files["banana_facts"].write_text(json.dumps(banana))
    files["true_length_profile"].write_text(BASE_PROFILE + "serve: {max_model_len: true}\n")
    files["unquoted_off_profile"].write_text(BASE_PROFILE + "fixes: {matmul_lora: off}\n")
    files["binary_profile"].write_bytes(b"name: x\n\xff\xfe\x00\x81 binary\n")
    files["binary_facts"].write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff")
    files["future_facts"].write_text('{"schema_version": 99, "gpus": []}\n')
    files["not_a_db"].write_text("these are my notes, not a database\n" * 40)
    files["a_file"].write_text("already here\n")
    files["secret_profile"].write_text(
        "name: secret\nplatform: cpu\nmodel: {source: /m}\nenv: {HF_TOKEN: abc}\n"
    )
    files["token_profile"].write_text(
        "name: token\nplatform: cpu\nmodel: {source: /m}\nenv: {MY_SETTING: sk-abcdefghijklmnopqrstuvwx}\n"
    )
    files["open_profile"].write_text("name: open\nmodel: {source: /m}\nserve: {host: 0.0.0.0}\n")
    files["open_cpu_profile"].write_text(
        "name: open-cpu\nplatform: cpu\nmodel: {source: /m}\nserve: {host: 0.0.0.0}\n"
    )
    blocked = files["no_psycopg"] / "psycopg"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'psycopg'\")\n")
    files["profiles"].mkdir()
    return files


# (case id, argv with {placeholders} from `bad`, exit code, substrings the output must hold)
CASES: list[tuple[str, list[str], int, list[str]]] = [
    ("store-unknown-scheme", ["results", "list", "--store", "mysql://x/y"], 1, ["mysql://x/y", "PostgreSQL"]),
    (
        "store-refused",
        ["results", "list", "--store", "postgresql://u:pw@127.0.0.1:1/db"],
        1,
        ["127.0.0.1:1/db", "Connection refused"],
    ),
    (
        "store-missing-driver",
        ["results", "list", "--store", "postgresql://u@127.0.0.1:1/db"],
        1,
        ["127.0.0.1:1/db", "psycopg", "vllm-deploykit[postgres]"],
    ),
    (
        "store-not-a-database",
        ["results", "list", "--store", "{not_a_db}"],
        1,
        ["{not_a_db}", "not a database"],
    ),
    ("store-unwritable", ["results", "show", "1", "--store", f"sqlite:///{UNWRITABLE}"], 1, [UNWRITABLE]),
    (
        "serve-store-unwritable",
        ["serve", "-p", "demo-cpu", "--store", f"sqlite:///{UNWRITABLE}"],
        1,
        [UNWRITABLE],
    ),
    (
        "smoke-store-unwritable",
        ["smoke", "--url", "http://127.0.0.1:9", "--model", "m", "--store", f"sqlite:///{UNWRITABLE}"],
        1,
        [UNWRITABLE],
    ),
    ("results-limit-0", ["results", "list", "--limit", "0"], 2, ["--limit"]),
    ("profile-missing", ["plan", "-p", "no-such-profile", "--no-validate"], 2, ["no-such-profile"]),
    (
        "profile-missing-path",
        ["plan", "-p", "/nonexistent/p.yaml", "--no-validate"],
        2,
        ["/nonexistent/p.yaml"],
    ),
    (
        "profile-not-utf8",
        ["plan", "-p", "{binary_profile}", "--no-validate"],
        2,
        ["{binary_profile}", "UTF-8"],
    ),
    ("profile-secret-name", ["plan", "-p", "{secret_profile}", "--no-validate"], 2, ["HF_TOKEN", "secret:"]),
    (
        "profile-secret-value",
        ["plan", "-p", "{token_profile}", "--no-validate"],
        2,
        ["MY_SETTING", "secret:"],
    ),
    (
        "facts-missing",
        ["plan", "-p", "demo-cpu", "--facts", "/nonexistent/facts.json", "--no-validate"],
        2,
        ["/nonexistent/facts.json"],
    ),
    (
        "facts-not-utf8",
        ["plan", "-p", "demo-cpu", "--facts", "{binary_facts}", "--no-validate"],
        2,
        ["{binary_facts}", "UTF-8"],
    ),
    (
        "facts-unknown-schema",
        ["plan", "-p", "demo-cpu", "--facts", "{future_facts}", "--no-validate"],
        2,
        ["{future_facts}", "schema_version"],
    ),
    ("fix-unknown", ["plan", "-p", "demo-cpu", "--fix", "bogus=on", "--no-validate"], 2, ["bogus=on"]),
    ("fix-bad-mode", ["plan", "-p", "demo-cpu", "--fix", "matmul_lora=maybe", "--no-validate"], 2, ["maybe"]),
    (
        "plan-cuda-without-gpu",
        ["plan", "-p", "gemma4-turing", "--facts", str(FACTS / "no-gpu.json"), "--no-validate"],
        2,
        ["no-gpu.json", "--facts"],
    ),
    ("probe-save-directory", ["probe", "--save", "{profiles}"], 2, ["{profiles}"]),
    ("serve-port-0", ["serve", "-p", "demo-cpu", "--port", "0"], 2, ["'--port': 0"]),
    ("serve-port-70000", ["serve", "-p", "demo-cpu", "--port", "70000"], 2, ["'--port': 70000"]),
    ("serve-profile-missing", ["serve", "-p", "no-such-profile"], 1, ["no-such-profile"]),
    (
        "serve-open-without-key",
        ["serve", "-p", "{open_cpu_profile}"],
        1,
        ["0.0.0.0", "allow_unauthenticated"],
    ),
    (
        "smoke-timeout-negative",
        ["smoke", "--url", "http://127.0.0.1:9", "--model", "m", "--timeout", "-1"],
        2,
        ["-1"],
    ),
    ("smoke-port-70000", ["smoke", "--url", "http://127.0.0.1:70000", "--model", "m"], 2, ["70000"]),
    ("smoke-not-a-url", ["smoke", "--url", "localhost-8000", "--model", "m"], 2, ["localhost-8000"]),
    (
        "render-out-is-a-file",
        [
            *("render", "systemd", "-p", "demo-cpu", "--facts", str(FACTS / "no-gpu.json")),
            *("--prefix", ABSENT_PREFIX, "--out", "{a_file}"),
        ],
        2,
        ["{a_file}"],
    ),
    (
        "render-cuda-without-gpu",
        [
            "render",
            "helm",
            "-p",
            "gemma4-turing",
            "--facts",
            str(FACTS / "no-gpu.json"),
            "--out",
            "{profiles}",
        ],
        2,
        ["no-gpu.json", "--facts"],
    ),
    (
        "render-open-without-key",
        [
            "render",
            "helm",
            "-p",
            "{open_profile}",
            "--facts",
            str(FACTS / "a100.json"),
            "--out",
            "{profiles}",
        ],
        2,
        ["{open_profile}", "allow_unauthenticated"],
    ),
    (
        "profiles-dir-missing",
        ["profiles", "list", "--dir", "/nonexistent/profiles"],
        2,
        ["/nonexistent/profiles"],
    ),
    # Issue 22, item 2: a store URL's password is never printed (the test checks SECRET for every case).
    (
        "store-password-in-query",
        ["results", "list", "--store", f"postgresql://u@127.0.0.1:1/db?password={SECRET}"],
        1,
        ["postgresql://u@127.0.0.1:1/db?password=***"],
    ),
    (
        "store-bad-port",
        ["results", "list", "--store", f"postgresql://u:{SECRET}@127.0.0.1:notaport/db"],
        1,
        ["postgresql://u:***@127.0.0.1:notaport/db", "not a URL"],
    ),
    (
        "store-raw-password",
        ["results", "list", "--store", f"postgresql://u:{SECRET}@:/%x@127.0.0.1:1/db"],
        1,
        ["postgresql://u:***@127.0.0.1:1/db"],
    ),
    (
        "smoke-url-password",
        ["smoke", "--url", f"http://u:{SECRET}@127.0.0.1:99999", "--model", "m"],
        2,
        ["http://u:***@127.0.0.1:99999"],
    ),
    # Item 3: profiles and facts that hung or crashed the loader.
    (
        "profile-alias-bomb",
        ["plan", "-p", "{bomb_profile}", "--no-validate"],
        2,
        ["{bomb_profile}:2:", "alias"],
    ),
    ("profile-20000-deep", ["plan", "-p", "{deep_profile}", "--no-validate"], 2, ["nested deeper than 64"]),
    (
        "profile-dev-zero",
        ["plan", "-p", "/dev/zero", "--no-validate"],
        2,
        ["/dev/zero", "not a regular file"],
    ),
    ("profile-fifo", ["plan", "-p", "{fifo}", "--no-validate"], 2, ["{fifo}", "named pipe"]),
    (
        "facts-100000-deep",
        ["plan", "-p", "demo-cpu", "--facts", "{deep_facts}", "--no-validate"],
        2,
        ["{deep_facts}", "nested deeper than 64"],
    ),
    (
        "facts-fifo",
        ["plan", "-p", "demo-cpu", "--facts", "{fifo}", "--no-validate"],
        2,
        ["{fifo}", "named pipe"],
    ),
    (
        "facts-dev-zero",
        ["plan", "-p", "demo-cpu", "--facts", "/dev/zero", "--no-validate"],
        2,
        ["/dev/zero", "not a regular file"],
    ),
    # Item 5: numbers that are not numbers.
    ("results-limit-1e20", ["results", "list", "--limit", "1e20"], 2, ["--limit", "1e20"]),
    ("results-limit-huge", ["results", "list", "--limit", "1" + "0" * 20], 2, ["--limit"]),
    ("results-show-huge", ["results", "show", "1" + "0" * 20], 2, ["ID", "1" + "0" * 20]),
    ("results-show-1e20", ["results", "show", "1e20"], 2, ["ID", "1e20"]),
    (
        "profile-max-model-len-true",
        ["plan", "-p", "{true_length_profile}", "--no-validate"],
        2,
        ["serve.max_model_len", "true is a boolean, not a number"],
    ),
    (
        "facts-compute-capability-banana",
        ["plan", "-p", "demo-cpu", "--facts", "{banana_facts}", "--no-validate"],
        2,
        ["{banana_facts}", "compute_capability", "'banana'"],
    ),
    # Item 10: messages that say what is wrong; stores that would lose every row.
    (
        "profile-unquoted-off",
        ["plan", "-p", "{unquoted_off_profile}", "--no-validate"],
        2,
        ["fixes.matmul_lora", "unquoted off/no/false", 'quote it, e.g. "off"'],
    ),
    (
        "facts-a-list",
        ["plan", "-p", "demo-cpu", "--facts", "{list_facts}", "--no-validate"],
        2,
        ["{list_facts}", "the top level is a list"],
    ),
    (
        "facts-null",
        ["plan", "-p", "demo-cpu", "--facts", "{null_facts}", "--no-validate"],
        2,
        ["{null_facts}", "the top level is null"],
    ),
    (
        "facts-schema-version-string",
        ["plan", "-p", "demo-cpu", "--facts", "{string_version_facts}", "--no-validate"],
        2,
        ["schema_version is the string '1'", "write the number 1"],
    ),
    ("store-in-memory", ["results", "list", "--store", "sqlite://"], 1, ["sqlite://", "in-memory"]),
    ("store-empty", ["results", "list", "--store", ""], 1, ["--store ''", "names no store"]),
    # Mistakes on the command line itself, caught by Typer's parser before any command runs.
    ("unknown-option", ["plan", "--profle", "demo-cpu"], 2, ["--profle", "--profile", "plan --help"]),
    ("unknown-command", ["servе"], 2, ["servе", "deploykit --help"]),
    ("missing-option", ["plan"], 2, ["'--profile'", "plan --help"]),
    ("bad-choice", ["probe", "--format", "xml"], 2, ["'xml'", "probe --help"]),
    ("option-without-value", ["render", "helm", "--profile"], 2, ["'--profile'"]),
]


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_deploykit(args, env=env, cwd=REPO)


@pytest.mark.parametrize(("args", "code", "named"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line(
    bad: dict[str, Path], tmp_path: Path, args: list[str], code: int, named: list[str]
) -> None:
    fill = {key: str(path) for key, path in bad.items()}
    argv = [arg.format(**fill) for arg in args]
    env = {**os.environ, "DEPLOYKIT_STORE": str(bad["store"]), "DEPLOYKIT_PROFILE_DIR": str(tmp_path)}
    if "postgresql://u@" in " ".join(argv):  # the missing-driver case: psycopg cannot be imported
        env["PYTHONPATH"] = os.pathsep.join([str(bad["no_psycopg"]), env.get("PYTHONPATH", str(REPO))])
    started = time.monotonic()
    result = run(argv, env)
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == code, output
    assert elapsed < HANG_LIMIT_S or "store" in " ".join(argv), f"{elapsed:.1f} s"
    assert "Traceback" not in output, output
    # One line of deploykit's closes stderr (serve reports on stdout: its verdict and the stored row);
    # no usage banner or boxed message around it.
    if result.stderr:
        assert result.stderr.splitlines()[-1].startswith("deploykit: "), result.stderr
    assert not any(mark in output for mark in ("Usage:", "╭", "│")), output
    for text in named:
        assert text.format(**fill) in output, output
    assert "pw@" not in output and SECRET not in output  # a store URL's password is never printed


def test_profiles_list_with_a_binary_profile_lists_it_as_invalid(bad: dict[str, Path]) -> None:
    directory = bad["profiles"]
    (directory / "garbage.yaml").write_bytes(b"\x00\xff\xfe\x81" * 64)
    env = {**os.environ, "DEPLOYKIT_STORE": str(bad["store"])}
    facts = str(FACTS / "t4.json")
    result = run(["profiles", "list", "--dir", str(directory), "--facts", facts, "-f", "json"], env)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "garbage" in result.stdout and "UTF-8" in result.stdout


def test_profiles_list_with_hostile_profiles_lists_them_as_invalid_at_once(
    bad: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 22, item 3: `profiles list` reads every file it sees; a bomb, a deep file or a FIFO among
    them is one invalid row each, and the command returns."""
    (tmp_path / "bomb.yaml").write_text(billion_laughs())
    (tmp_path / "deep.yaml").write_text(bad["deep_profile"].read_text())
    os.mkfifo(tmp_path / "fifo.yaml")
    env = {**os.environ, "DEPLOYKIT_STORE": str(bad["store"])}
    facts = str(FACTS / "t4.json")
    started = time.monotonic()
    result = run(["profiles", "list", "--dir", str(tmp_path), "--facts", facts, "-f", "json"], env)
    assert time.monotonic() - started < HANG_LIMIT_S
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert {rows[name]["status"] for name in ("bomb", "deep", "fifo")} == {"invalid"}


def test_vllm_plugins_leaving_deploykit_out_while_a_fix_is_on_is_a_warning(tmp_path: Path) -> None:
    """Issue 22, item 10: VLLM_PLUGINS names the only plugins vLLM loads; without deploykit's the fix
    would be silently absent."""
    import yaml

    shipped = yaml.safe_load((REPO / "profiles" / "demo-gemma4-fp16.yaml").read_text())  # fp32_projection on
    profile = tmp_path / "plugins.yaml"
    plan = ["plan", "-p", str(profile), "--facts", str(FACTS / "no-gpu.json"), "--no-validate"]
    for plugins, warned in (("other", True), ("other,deploykit", False)):
        profile.write_text(yaml.safe_dump({**shipped, "env": {**shipped["env"], "VLLM_PLUGINS": plugins}}))
        result = run(plan, dict(os.environ))
        assert result.returncode == 0, result.stderr
        warning = f"VLLM_PLUGINS={plugins!r} leaves out deploykit's plugin"
        assert (warning in result.stdout + result.stderr) is warned, result.stdout + result.stderr


def test_the_shipped_profiles_name_no_path_relative_to_the_current_directory() -> None:
    """Issue 22, item 10: a relative PYTHONPATH or model path imports whatever the directory deploykit
    runs in holds."""
    import yaml

    for path in sorted((REPO / "profiles").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        source = data["model"]["source"]
        assert source.startswith(("/", "builtin:")) or ("/" in source and not source.startswith(".")), path
        for entry in str((data.get("env") or {}).get("PYTHONPATH", "/")).split(":"):
            assert entry.startswith("/"), (path, entry)
