"""`deploykit render` writes only inside --out, never through a link, never over a file a person changed
(unless --force), never over a filled-in secrets file, and all files or none. Real renders, real files;
the half-way failure is a real EFBIG from a file-size limit on the deploykit process."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from tests.cli_process import run_deploykit
from tests.vllm_harness import REPO

FACTS = REPO / "tests" / "fixtures" / "facts"
SYSTEMD = ["render", "systemd", "-p", "demo-cpu", "--facts", str(FACTS / "no-gpu.json"), "--prefix", "/opt/v"]
HELM = ["render", "helm", "-p", "gemma4-turing", "--facts", str(FACTS / "t4.json")]
UNIT = "deploykit-demo-cpu.service"
SECRETS = "demo-cpu.env.example"


def render(
    args: list[str], out: Path, *extra: str, limit_bytes: int | None = None
) -> subprocess.CompletedProcess[str]:
    def file_size_limit() -> None:
        if limit_bytes is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    if limit_bytes is None:
        return run_deploykit([*args, "--out", str(out), *extra], cwd=REPO)
    return subprocess.run(
        [sys.executable, "-m", "deploykit", *args, "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        preexec_fn=file_size_limit,
    )


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


def test_a_link_inside_out_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    out, victim = tmp_path / "out", tmp_path / "victim"
    assert render(SYSTEMD, out).returncode == 0
    victim.write_text("precious\n")
    (out / "demo-cpu.yaml").unlink()
    (out / "demo-cpu.yaml").symlink_to(victim)
    before = snapshot(out)
    for extra in ([], ["--force"]):
        result = render(SYSTEMD, out, *extra)
        assert result.returncode == 2, result.stderr
        assert "demo-cpu.yaml is a symbolic link" in result.stderr and "Traceback" not in result.stderr
    assert victim.read_text() == "precious\n" and snapshot(out) == before


def test_a_linked_directory_inside_out_is_refused(tmp_path: Path) -> None:
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    out.mkdir()
    (out / "gemma4-turing").symlink_to(elsewhere)
    result = render(HELM, out, "--force")
    assert result.returncode == 2 and "is a symbolic link or not a directory" in result.stderr, result.stderr
    assert not any(elsewhere.iterdir())


def test_a_file_the_user_changed_is_kept_unless_force(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert render(HELM, out).returncode == 0
    values = out / "gemma4-turing" / "values.yaml"
    edited = values.read_text() + "# my change\n"
    values.write_text(edited)
    before = snapshot(out)
    refused = render(HELM, out)
    assert refused.returncode == 2, refused.stderr
    assert f"{values} was changed since deploykit wrote it" in refused.stderr and "--force" in refused.stderr
    assert snapshot(out) == before  # no file of the set changed either
    forced = render(HELM, out, "--force")
    assert forced.returncode == 0, forced.stderr
    assert "# my change" not in values.read_text()
    again = render(HELM, out)  # deploykit's own files, unchanged since: rendered over without a word
    assert again.returncode == 0, again.stderr


def test_a_file_deploykit_did_not_write_is_not_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / UNIT).write_text("[Unit]\nDescription=mine\n")
    result = render(SYSTEMD, out)
    assert result.returncode == 2 and f"{out / UNIT} was not written by deploykit" in result.stderr, (
        result.stderr
    )
    assert (out / UNIT).read_text() == "[Unit]\nDescription=mine\n"


def test_a_filled_in_secrets_file_is_never_overwritten_even_with_force(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert render(SYSTEMD, out).returncode == 0
    secrets = out / SECRETS
    filled = secrets.read_text() + "MY_TOKEN=s3cret-value\n"
    secrets.write_text(filled)
    for extra in ([], ["--force"]):
        result = render(SYSTEMD, out, *extra)
        assert result.returncode == 0, result.stderr
        assert f"{secrets}: it exists and may hold filled-in secrets: kept" in result.stderr
        assert secrets.read_text() == filled and oct(secrets.stat().st_mode & 0o777) == "0o600"


def test_a_failure_halfway_leaves_no_half_set(tmp_path: Path) -> None:
    """The chart's wheel (~250 KiB) is past a 100 KB file-size limit: writing it fails after the chart's
    small files were written; none of them (nor any directory made for them) is left in --out."""
    fresh = tmp_path / "fresh"
    result = render(HELM, fresh, limit_bytes=100_000)
    assert result.returncode == 2 and "File too large" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not fresh.exists() or not any(fresh.iterdir())

    out = tmp_path / "out"
    assert render(HELM, out).returncode == 0
    before = snapshot(out)
    assert render(HELM, out, "--force", limit_bytes=100_000).returncode == 2
    assert snapshot(out) == before and not [
        p for p in out.iterdir() if p.name.startswith(".deploykit-writing")
    ]


def test_the_charts_command_is_the_plans_argv_as_kubernetes_reads_it(tmp_path: Path) -> None:
    """Kubernetes expands `$(NAME)` in a container's command and env and reduces `$$` to `$`: the chart
    doubles every `$`, so the container runs the plan's words exactly."""
    profile = tmp_path / "dollar.yaml"
    shipped = yaml.safe_load((REPO / "profiles" / "gemma4-turing.yaml").read_text())
    shipped["name"] = "dollar"
    shipped["serve"]["extra_args"] = ["--chat-template-content-format", "$(HOME)-x$y$$z"]
    shipped["env"]["MY_SETTING"] = "$(PATH)"
    profile.write_text(yaml.safe_dump(shipped))
    out = tmp_path / "out"
    result = render(["render", "helm", "-p", str(profile), "--facts", str(FACTS / "t4.json")], out)
    assert result.returncode == 0, result.stderr
    values = yaml.safe_load((out / "dollar" / "values.yaml").read_text())
    assert "$$(HOME)-x$$y$$$$z" in values["command"]
    assert values["env"]["MY_SETTING"] == "$$(PATH)"


def test_render_writes_nothing_outside_out(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert render(SYSTEMD, out).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert os.path.isfile(out / ".deploykit-render.json")


def named(directory: Path, base: str, name: str) -> str:
    """A shipped profile under another name, as a file in `directory`."""
    profile = directory / f"{name}.yaml"
    shipped = yaml.safe_load((REPO / "profiles" / f"{base}.yaml").read_text())
    shipped["name"] = name
    profile.write_text(yaml.safe_dump(shipped))
    return str(profile)


def test_two_profiles_never_write_one_chart(tmp_path: Path) -> None:
    """`x.y` and `x_y` are one Kubernetes name (`x-y`): the second render into the same --out is refused in
    one line naming the profile the chart is of, --force or not, and the first chart stays as it was."""
    out = tmp_path / "out"
    first = render(["render", "helm", "-p", named(tmp_path, "gemma4-turing", "x.y"), *HELM[4:]], out)
    assert first.returncode == 0, first.stderr
    before = snapshot(out)
    for extra in ([], ["--force"]):
        second = render(
            ["render", "helm", "-p", named(tmp_path, "gemma4-turing", "x_y"), *HELM[4:]], out, *extra
        )
        assert second.returncode == 2, second.stderr
        line = second.stderr.splitlines()[-1]  # (after the plan's warnings)
        assert line.startswith("deploykit: render helm: ") and str(out / "x-y") in line, line
        assert "profile 'x.y', not 'x_y'" in line, line
    assert snapshot(out) == before
    again = render(["render", "helm", "-p", named(tmp_path, "gemma4-turing", "x.y"), *HELM[4:]], out)
    assert again.returncode == 0, again.stderr  # the chart's own profile renders over it as before


def test_two_profiles_never_write_one_unit(tmp_path: Path) -> None:
    """Unit names keep the profile's name as it is (`x.y`, `x_y`: two sets side by side); where two names do
    meet (profile `x`'s smoke unit is profile `x-smoke`'s server unit) the second render is refused."""
    out = tmp_path / "out"
    for name in ("x.y", "x_y"):
        result = render(["render", "systemd", "-p", named(tmp_path, "demo-cpu", name), *SYSTEMD[4:]], out)
        assert result.returncode == 0, result.stderr
    for name in ("x.y", "x_y"):
        assert f"from profile {name}\n" in (out / f"deploykit-{name}.service").read_text()
    out = tmp_path / "meet"
    assert (
        render(["render", "systemd", "-p", named(tmp_path, "demo-cpu", "x"), *SYSTEMD[4:]], out).returncode
        == 0
    )
    before = snapshot(out)
    second = render(["render", "systemd", "-p", named(tmp_path, "demo-cpu", "x-smoke"), *SYSTEMD[4:]], out)
    assert second.returncode == 2, second.stderr
    line = second.stderr.splitlines()[-1]
    assert str(out / "deploykit-x-smoke.service") in line and "profile 'x'" in line, line
    assert snapshot(out) == before
