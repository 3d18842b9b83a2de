"""The canary unit's root helper trusts a prefix only when root alone can change it (issue 43): a prefix the
service user can write never runs a line of its code as root. The booted-systemd proof is
tests/e2e/test_systemd_hostile_e2e.py; here the check itself, and the helper as the unit runs it."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploykit import exit_codes
from deploykit.render import root_helper
from deploykit.render.root_helper import untrusted_reason, untrusted_tree
from tests import unit_prefix
from tests.render.conftest import deploykit
from tests.unit_prefix import build_prefix
from tests.vllm_harness import REPO

OTHER_UID = 65534  # nobody: the service user, or any user but root
HELPER = Path(root_helper.__file__)
FACTS = REPO / "tests" / "fixtures" / "facts"
MARK_CODE = "import os; open({mark!r}, 'w').write(str(os.geteuid()))\n"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the ownership checks need root to chown")


@pytest.fixture
def prefix() -> Iterator[Path]:
    """A prefix of its own (tests/unit_prefix.py) where the units' sandbox sees it, removed after."""
    unit_prefix.ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    target = unit_prefix.ROOT / f"prefix-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        yield build_prefix(target)
    finally:
        shutil.rmtree(target, ignore_errors=True)


def test_the_copied_statuses_are_exit_codes() -> None:
    assert (root_helper.OK, root_helper.FAILED) == (exit_codes.OK, exit_codes.FAILED)
    restart_statuses = (str(exit_codes.CORRUPT), str(exit_codes.HUNG))
    assert restart_statuses == root_helper.RESTART_STATUSES


def test_a_root_owned_chain_is_trusted_and_each_weak_link_is_named(tmp_path: Path) -> None:
    tree = tmp_path / "prefix" / "lib"
    tree.mkdir(parents=True)
    (tree / "module.py").write_text("x = 1\n")
    assert untrusted_tree(str(tmp_path / "prefix")) is None

    os.chown(tree, OTHER_UID, -1)
    assert untrusted_reason(str(tree / "module.py")) == f"{tree} is owned by uid {OTHER_UID}, not root"
    os.chown(tree, 0, -1)

    (tree / "module.py").chmod(0o666)  # root's, but anyone may rewrite it
    assert (
        untrusted_tree(str(tmp_path / "prefix"))
        == f"{tree / 'module.py'} is writable by group or others (mode 0666)"
    )
    (tree / "module.py").chmod(0o644)
    tree.chmod(0o775)
    assert untrusted_reason(str(tree / "module.py")) == f"{tree} is writable by group or others (mode 0775)"


def test_a_sticky_root_directory_passes_but_not_another_users_entry_in_it(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)  # as /tmp: anyone may add an entry, only its owner may replace it
    (shared / "roots").mkdir()
    assert untrusted_reason(str(shared / "roots")) is None
    theirs = shared / "theirs"
    theirs.symlink_to(shared / "roots")
    os.chown(theirs, OTHER_UID, -1, follow_symlinks=False)
    assert untrusted_reason(str(theirs)) == f"{theirs} is owned by uid {OTHER_UID}, not root"


def test_a_link_is_followed_to_where_it_points(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chown(elsewhere, OTHER_UID, -1)
    link = tmp_path / "python"
    link.symlink_to(elsewhere)  # root's own link, in root's directory, to a directory another user owns
    assert untrusted_reason(str(link)) == f"{elsewhere} is owned by uid {OTHER_UID}, not root"
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert "more than 40 symbolic links" in str(untrusted_reason(str(loop)))


def run_helper(
    prefix: Path, tmp_path: Path, *argv: str, status: str = "3"
) -> subprocess.CompletedProcess[str]:
    """The canary unit's ExecStopPost= line, with systemd's variables, and a `systemctl` that records."""
    fake_bin = tmp_path / "fake-bin"
    fake_bin.mkdir(exist_ok=True)
    recorder = fake_bin / "systemctl"
    recorder.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/systemctl.log\n')
    recorder.chmod(0o755)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "EXIT_CODE": "exited", "EXIT_STATUS": status}
    command = [str(prefix / "bin" / "python"), *argv, "--restart", "x.service", "--exit-status", "3"]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_a_prefix_the_service_user_can_write_runs_nothing_as_root(prefix: Path, tmp_path: Path) -> None:
    site = next((prefix / "lib").glob("python3.*/site-packages"))
    mark = tmp_path / "planted-ran"
    os.chown(site, OTHER_UID, -1)  # the service user owns the prefix's site-packages, and plants a .pth
    (site / "zz-planted.pth").write_text(MARK_CODE.format(mark=str(mark)))
    os.chown(site / "zz-planted.pth", OTHER_UID, -1)

    # The command line the unit had before: the prefix's site-packages, and so the planted line, run as root.
    before = run_helper(prefix, tmp_path, "-I", "-m", "deploykit.render.on_corruption")
    assert mark.read_text() == "0", before.stdout + before.stderr
    mark.unlink()
    (tmp_path / "systemctl.log").unlink()

    refused = run_helper(prefix, tmp_path, "-I", "-S", str(HELPER))
    assert refused.returncode == exit_codes.FAILED, refused.stderr
    assert not mark.exists(), "the planted .pth ran as root"
    (line,) = refused.stdout.splitlines()
    assert line.startswith(f"root helper: refused to run deploykit from {prefix} as root: ")
    assert f"{site} is owned by uid {OTHER_UID}, not root" in line and "x.service is stopped instead" in line
    assert (tmp_path / "systemctl.log").read_text() == "stop --no-block x.service\n"


def test_a_planted_module_in_the_package_is_refused_and_a_clean_end_leaves_the_server(
    prefix: Path, tmp_path: Path
) -> None:
    package = next((prefix / "lib").glob("python3.*/site-packages/deploykit"))
    planted = package / "render" / "on_corruption.py"
    os.chown(planted, OTHER_UID, -1)
    done = run_helper(prefix, tmp_path, "-I", "-S", str(HELPER), status="0")
    assert done.returncode == exit_codes.FAILED
    assert f"{planted} is owned by uid {OTHER_UID}, not root" in done.stdout
    assert "x.service is left alone (the canary ended exited 0)" in done.stdout
    assert not (tmp_path / "systemctl.log").exists()  # nothing to do, nothing done


def test_a_trusted_prefix_runs_the_restart_under_its_cap(prefix: Path, tmp_path: Path) -> None:
    done = run_helper(prefix, tmp_path, "-I", "-S", str(HELPER))
    assert done.returncode == exit_codes.OK, done.stdout + done.stderr
    assert "restarting x.service" in done.stdout
    assert (tmp_path / "systemctl.log").read_text() == "restart --no-block x.service\n"
    check = subprocess.run(
        [str(prefix / "bin" / "python"), "-I", "-S", str(HELPER), root_helper.CHECK_FLAG],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (check.returncode, check.stdout) == (exit_codes.OK, "trusted\n")


def test_render_refuses_a_prefix_root_cannot_trust(prefix: Path, tmp_path: Path) -> None:
    site = next((prefix / "lib").glob("python3.*/site-packages"))
    os.chown(site, OTHER_UID, -1)
    args = ["render", "systemd", "-p", "demo-cpu", "--facts", str(FACTS / "no-gpu.json")]
    args += ["--prefix", str(prefix), "--out", str(tmp_path / "out")]
    refused = deploykit(*args, check=False)
    assert refused.returncode == exit_codes.USAGE
    (line,) = refused.stderr.strip().splitlines()
    assert f"--prefix {prefix}: root cannot trust it ({site} is owned by uid {OTHER_UID}, not root)" in line
    assert not (tmp_path / "out").exists()
