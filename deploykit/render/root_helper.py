"""The canary unit's root helper, as systemd starts it: `+PREFIX/bin/python -I -S root-helper.py ARGS`.

`render systemd` writes this file into the unit set (`deploykit-root-helper.py`), to be installed root-owned
outside the prefix (`/usr/local/libexec/deploykit/root-helper.py`). It runs as root before any of the prefix's
own code: `-S` keeps site-packages (and the `.pth` files in them, which are code) off `sys.path` until the
prefix is found trustworthy, so a prefix the service user can write never runs anything as root. Trustworthy
means what sshd's StrictModes asks of a home: every directory from `/` down to the interpreter, the
site-packages directories and the deploykit package (each link's own directory too, links followed as the
kernel follows them), and every file in the package and every `.pth` file, owned by root and writable by no
group or other user. A root-owned sticky directory (`/tmp`) passes: only an entry's owner may replace it.

Trusted: site-packages are added (`site.main()`), and `deploykit.render.on_corruption` runs with the same
arguments. Not trusted: one journal line, nothing of the prefix imported, and when the canary's verdict asked
for a restart the server is stopped instead (fail closed: it cannot be restarted under a cap nobody can
trust). `render systemd` runs the same check (`--check-prefix`) on a prefix that exists where it renders.

Standard library only, and nothing of deploykit before the prefix is trusted: this file runs outside the
package.
"""

from __future__ import annotations

import importlib.util
import os
import site
import stat
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence

CHECK_FLAG = "--check-prefix"
"""Print `trusted` or the reason this interpreter's prefix is not, and exit (render's check)."""
MAX_LINKS = 40  # as the kernel's own limit on links followed in one lookup
# deploykit.exit_codes' OK and FAILED, and the canary statuses that ask for a restart (CORRUPT and HUNG,
# on_corruption's default): copies, since nothing of deploykit may be imported before the prefix is trusted
# (tests/render/test_root_helper.py holds them to the originals).
OK, FAILED = 0, 1
RESTART_STATUSES = ("3", "5")


def _owner_problem(path: str, info: os.stat_result) -> str | None:
    """Why one existing file or directory is not root's alone (None: it is)."""
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != 0:
        return f"{path} is owned by uid {info.st_uid}, not root"
    if stat.S_ISLNK(info.st_mode):
        return None  # a link's own mode means nothing; its directory and its target are checked
    if mode & 0o022 and not (stat.S_ISDIR(info.st_mode) and mode & stat.S_ISVTX):
        return f"{path} is writable by group or others (mode {mode:04o})"
    return None


def untrusted_reason(path: str) -> str | None:
    """Why root must not run what lies at `path`: the first directory, link or file along it, from `/` down,
    that is not root's own or that another user may change; None when only root can change any of it."""
    if not os.path.isabs(path):
        return f"{path} is not an absolute path"
    pending = [part for part in path.split("/") if part]
    current, links = "/", 0
    problem = _owner_problem("/", os.lstat("/"))
    while pending and problem is None:
        name = pending.pop(0)
        if name == ".":
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        try:
            info = os.lstat(candidate)
        except OSError as exc:
            return f"{candidate}: {exc.strerror}"
        problem = _owner_problem(candidate, info)
        if problem is None and stat.S_ISLNK(info.st_mode):
            links += 1
            if links > MAX_LINKS:
                return f"{path}: more than {MAX_LINKS} symbolic links"
            target = os.readlink(candidate)
            pending = [part for part in target.split("/") if part] + pending
            current = "/" if target.startswith("/") else current
            continue
        current = candidate
    return problem


def untrusted_tree(directory: str) -> str | None:
    """`untrusted_reason` for `directory`, then for everything below it (a link inside is followed)."""
    problem = untrusted_reason(directory)
    for root, directories, files in os.walk(directory) if problem is None else ():
        for name in sorted([*directories, *files]):
            path = os.path.join(root, name)
            try:
                info = os.lstat(path)
            except OSError as exc:
                return f"{path}: {exc.strerror}"
            problem = untrusted_reason(path) if stat.S_ISLNK(info.st_mode) else _owner_problem(path, info)
            if problem is not None:
                return problem
    return problem


def first_problem(checks: Iterable[tuple[str, bool]]) -> str | None:
    """The first problem among (path, whole tree?) checks, in order."""
    for path, tree in checks:
        problem = untrusted_tree(path) if tree else untrusted_reason(path)
        if problem is not None:
            return problem
    return None


def environment() -> tuple[str, str | None]:
    """The prefix `site.main()` will take its site-packages from, found as site.py finds it (a venv's
    pyvenv.cfg beside or above the interpreter as invoked), and that pyvenv.cfg; under -S, `sys.prefix` is
    still the base interpreter's."""
    bin_dir = os.path.dirname(os.path.abspath(sys.executable))
    venv = os.path.dirname(bin_dir)
    for config in (os.path.join(bin_dir, "pyvenv.cfg"), os.path.join(venv, "pyvenv.cfg")):
        if os.path.isfile(config):
            return venv, config
    return sys.prefix, None


def site_checks() -> list[tuple[str, bool]]:
    """Before site-packages are added: the interpreter as invoked (its links followed), the standard
    library, a venv's pyvenv.cfg, and each site-packages directory with every `.pth` file in it (they run
    code when added); a venv that includes the system's site-packages, those too."""
    prefix, config = environment()
    checks = [(sys.executable, False), (os.path.dirname(os.__file__), False)]
    prefixes = [prefix]
    if config is not None:
        checks.append((config, False))
        with open(config, encoding="utf-8", errors="replace") as lines:
            if any(_setting(line) == ("include-system-site-packages", "true") for line in lines):
                prefixes.append(sys.base_prefix)
    for directory in site.getsitepackages(prefixes):
        if not os.path.isdir(directory):
            continue
        checks.append((directory, False))
        pth_files = sorted(name for name in os.listdir(directory) if name.endswith(".pth"))
        checks += [(os.path.join(directory, name), False) for name in pth_files]
    return checks


def _setting(line: str) -> tuple[str, str]:
    key, _, value = line.partition("=")
    return key.strip().lower(), value.strip().lower()


def package_problem() -> str | None:
    """After site-packages are added: the deploykit package the import system finds, whole."""
    spec = importlib.util.find_spec("deploykit")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        return "no deploykit package in this prefix"
    return first_problem((location, True) for location in locations)


def prefix_problem(own_file: str | None) -> str | None:
    """Why this interpreter's prefix cannot be trusted by root (None: it can); site-packages are added on the
    way, and only once they are found trustworthy. `own_file`: this helper's own path, checked first."""
    problem = first_problem([*([(own_file, False)] if own_file else []), *site_checks()])
    if problem is not None:
        return problem
    site.main()
    return package_problem()


def _value(argv: Sequence[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == flag]


def refuse(argv: Sequence[str], env: Mapping[str, str], problem: str) -> int:
    """One journal line; the server stopped when the canary asked for a restart (fail closed)."""
    unit = (_value(argv, "--restart") or ["the server"])[0]
    statuses = _value(argv, "--exit-status") or list(RESTART_STATUSES)
    wants_restart = env.get("EXIT_CODE") == "exited" and env.get("EXIT_STATUS") in statuses
    ended = f"{env.get('EXIT_CODE', '?')} {env.get('EXIT_STATUS', '?')}"
    action = (
        f"{unit} is stopped instead of restarted (fail closed); install it as root (docs/security.md), "
        f"then `systemctl start {unit}`"
        if wants_restart
        else f"{unit} is left alone (the canary ended {ended})"
    )
    prefix, _ = environment()
    print(f"root helper: refused to run deploykit from {prefix} as root: {problem}; {action}", flush=True)
    if wants_restart and unit != "the server":
        subprocess.run(["systemctl", "stop", "--no-block", unit], check=False)
    return FAILED


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    if argv[:1] == [CHECK_FLAG]:
        problem = prefix_problem(None)
        print(problem or "trusted")
        return OK if problem is None else FAILED
    problem = prefix_problem(os.path.abspath(__file__))
    if problem is not None:
        return refuse(argv, env, problem)
    from deploykit.render.on_corruption import main as on_corruption

    return on_corruption(argv)


if __name__ == "__main__":
    sys.exit(main())
