"""What deploykit knows about vLLM versions, without importing vLLM.

Every fact here names where it came from in vLLM's source or history.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """'0.32.0+cpu' → (0, 32, 0); None or unparsable → None."""
    if not text:
        return None
    match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def is_cpu_build(version_text: str | None) -> bool:
    """vLLM picks its CPU platform from a "cpu" in its version (vllm/platforms/__init__.py)."""
    return bool(version_text) and "cpu" in str(version_text)


# vLLM PR #44443 ("[ModelRunner V2] Enable by default for all dense models", merged 2026-07-02) made
# VllmConfig.use_v2_model_runner default to True when Triton works and no unsupported feature is set
# (vllm/config/vllm.py). Its first release is v0.25.0 (release notes: "Model Runner V2 is now the
# default for all dense models (#44443)"). Earlier, narrower steps: v0.22.0 Qwen3 dense only (#39337),
# v0.23.0 also Llama/Mistral dense (#43458); later #53183 extended the default to MoE/hybrid models.
# The installed 0.32 source has no per-architecture list left: only Triton and unsupported features.
V2_RUNNER_DEFAULT_SINCE: tuple[int, int, int] = (0, 25, 0)


# vLLM 0.34.0 deleted the V1 model runner, the V1 sampler, vllm/v1/sample/ops/penalties.py and the V1
# logits-processor package vllm.v1.sample.logits_processor (read from 0.34.0's wheel). Its
# vllm/platforms/interface.py now refuses VLLM_USE_V2_MODEL_RUNNER=0 at start-up ("Model Runner V1 has been
# removed. Unset this variable.") and only warns about =1; envs.py no longer defines the variable. From
# 0.34 every platform runs the V2 runner.
V1_RUNNER_REMOVED_IN: tuple[int, int, int] = (0, 34, 0)
RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
"""The variable that chose the runner (0.25-0.33); 0.34 refuses =0 and ignores =1."""


def release_label(version: tuple[int, int, int]) -> str:
    return ".".join(str(part) for part in version)


def v1_runner_removed(vllm_version: str | None) -> bool:
    """True when the target vLLM has no V1 model runner any more (0.34 and later)."""
    parsed = parse_version(vllm_version)
    return parsed is not None and parsed >= V1_RUNNER_REMOVED_IN


def runner_choice_problem(vllm_version: str | None, model_runner: str) -> str | None:
    """One line when the profile asks for a runner the target vLLM no longer has; None otherwise."""
    if model_runner == "v1" and v1_runner_removed(vllm_version):
        return (
            f"serve.model_runner: v1, but vLLM {vllm_version} has no V1 model runner (removed in vLLM "
            f"{release_label(V1_RUNNER_REMOVED_IN)}): set `serve.model_runner: auto`, or target vLLM "
            f"< {release_label(V1_RUNNER_REMOVED_IN)} with the profile's vllm_version"
        )
    return None


def runner_env_value(vllm_version: str | None, model_runner: str) -> str | None:
    """What deploykit writes to VLLM_USE_V2_MODEL_RUNNER for the profile's choice: nothing for `auto`,
    and nothing for a vLLM that removed the V1 runner (=0 stops it at start-up, =1 is redundant)."""
    if model_runner not in ("v1", "v2") or v1_runner_removed(vllm_version):
        return None
    return "1" if model_runner == "v2" else "0"


def default_model_runner(vllm_version: str | None, platform: str) -> str:
    """ "v1" or "v2": the model runner the target vLLM picks when VLLM_USE_V2_MODEL_RUNNER is unset.

    Before 0.34 the V2 runner needs Triton on a GPU (config/vllm.py: "Model Runner V2 requires Triton;
    using the V1 model runner instead"), so the CPU build runs V1 whatever its version; from 0.34 there is
    only the V2 runner, on every platform.
    """
    if v1_runner_removed(vllm_version):
        return "v2"
    if platform == "cpu" or is_cpu_build(vllm_version):
        return "v1"
    parsed = parse_version(vllm_version)
    if parsed is None:
        return "v2"  # unknown target: assume the newest behaviour
    return "v2" if parsed >= V2_RUNNER_DEFAULT_SINCE else "v1"


# --- the vLLM versions this release is tested with ----------------------------------------------------

# The one statement of which vLLM versions this release of deploykit is tested with (a PEP 440 specifier;
# pyproject's [gpu] and [cpu] extras carry the same bounds, held to it by tests/test_vllm_compat.py, and
# every release in it has a shipped table, deploykit/vllm_tables). "Tested" means, for each release in it:
# - 0.32 (vLLM's CPU build, installed in the test venv): the whole suite, the end-to-end tests that start a
#   real `vllm serve` with the fixes applied (tests/e2e) included;
# - 0.33 and 0.34 (no CPU build exists; the Python sources of their CUDA wheels, imported over the CPU
#   build's torch): the tier tests/vllm_releases, i.e. each fix's target check and decision rule, the
#   module-level fix tests that need no compiled kernel, the status route's install, and the shipped option
#   table against that release's live parser. No real server, no CUDA kernel (docs/status.md says what is
#   not proven).
# Other versions may well work, but nothing here has proven it: `deploykit plan` warns about a target
# outside the range. Widen it only with a shipped table and the tier passing on the new release
# (`make vllm-release VERSION=X` produces both; this line is then the one hand edit).
TESTED_VLLM = ">=0.32,<0.35"

# PEP 440 versions (vLLM's own are `0.32.0`, `0.33.0rc1`, `0.32.0+cpu`, `0.32.1.dev3+g1a2b3c`), read here
# rather than with `packaging`, which nothing on `deploykit plan`'s path imports (tests/test_vllm_compat.py
# holds the two to the same verdicts).
_PEP440 = re.compile(
    r"""
    ^\s*v?
    (?:(?P<epoch>\d+)!)?
    (?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre_l>alpha|beta|preview|pre|rc|a|b|c)[-_.]?(?P<pre_n>\d+)?)?
    (?:-(?P<post_n1>\d+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>\d+)?)?
    (?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    \s*$
    """,
    re.VERBOSE | re.IGNORECASE,
)
_PRE_PHASE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}

# Ordering key of a public version (PEP 440's order; the local label plays no part in a range check):
# epoch, release without trailing zeros, pre-release, post-release, dev-release.
_Key = tuple[int, tuple[int, ...], tuple[int, ...], int, tuple[int, ...]]


@dataclass(frozen=True)
class _Version:
    epoch: int
    release: tuple[int, ...]
    pre: tuple[int, int] | None  # (phase: 0 a, 1 b, 2 rc; number)
    post: int | None
    dev: int | None

    @property
    def is_prerelease(self) -> bool:
        return self.pre is not None or self.dev is not None

    @property
    def base(self) -> tuple[int, tuple[int, ...]]:
        return self.epoch, _trimmed(self.release)

    @property
    def key(self) -> _Key:
        if self.pre is None and self.post is None and self.dev is not None:
            pre: tuple[int, ...] = (-1,)  # 1.0.dev1 sorts before 1.0a1
        elif self.pre is None:
            pre = (3,)  # a final (or post) release sorts after every pre-release
        else:
            pre = self.pre
        post = -1 if self.post is None else self.post
        dev = (1,) if self.dev is None else (0, self.dev)
        return self.epoch, _trimmed(self.release), pre, post, dev


def _trimmed(release: tuple[int, ...]) -> tuple[int, ...]:
    end = len(release)
    while end > 1 and release[end - 1] == 0:
        end -= 1
    return release[:end]


def _parse_pep440(text: str) -> _Version | None:
    match = _PEP440.match(text)
    if match is None:
        return None
    parts = match.groupdict()
    pre = None
    if parts["pre_l"]:
        pre = (_PRE_PHASE[parts["pre_l"].lower()], int(parts["pre_n"] or 0))
    post = None
    if parts["post_n1"] or parts["post_l"]:
        post = int(parts["post_n1"] or parts["post_n2"] or 0)
    return _Version(
        epoch=int(parts["epoch"] or 0),
        release=tuple(int(p) for p in parts["release"].split(".")),
        pre=pre,
        post=post,
        dev=int(parts["dev_n"] or 0) if parts["dev_l"] else None,
    )


def _clause_matches(version: _Version, clause: str) -> bool:
    """One `OP VERSION` clause of a specifier: PEP 440's ordered comparisons and `==` / `!=` (no `*`)."""
    match = re.fullmatch(r"\s*(>=|<=|==|!=|>|<)\s*(\S+)\s*", clause)
    bound = _parse_pep440(match.group(2)) if match else None
    if match is None or bound is None or "+" in clause:
        raise ValueError(f"unsupported version specifier clause {clause!r}")
    op = match.group(1)
    if op == ">=":
        return version.key >= bound.key
    if op == "<=":
        return version.key <= bound.key
    if op == "==":
        return version.key == bound.key
    if op == "!=":
        return version.key != bound.key
    same_base = version.base == bound.base
    if op == "<":  # `<0.33` excludes 0.33's own pre-releases (0.33.0rc1, 0.33.0.dev2)
        return version.key < bound.key and not (
            same_base and version.is_prerelease and not bound.is_prerelease
        )
    # `>0.32` excludes 0.32's own post-releases
    return version.key > bound.key and not (same_base and version.post is not None and bound.post is None)


def version_in_range(version_text: str | None, specifier: str = TESTED_VLLM) -> bool | None:
    """Whether a version lies in a PEP 440 range such as TESTED_VLLM; None when the version is unknown or
    is not a PEP 440 version. The local label plays no part (`0.32.0+cpu` is in `>=0.32,<0.33`); a
    pre-release is in a range like any version, except that `<0.33` excludes 0.33's own (`0.33.0rc1`)."""
    if not version_text:
        return None
    version = _parse_pep440(version_text)
    if version is None:
        return None
    return all(_clause_matches(version, clause) for clause in specifier.split(","))


def vllm_image_tag(version: str) -> str:
    """The tag of vLLM's official images (`vllm/vllm-openai:v0.33.0`) for a vLLM version: `0.33.0` →
    `v0.33.0`, `0.32.0+cpu` → `v0.32.0` (a local label such as `+cpu` names the build, never a tag).

    The tag names the release whatever the build; whether an image exists under it is the registry's
    matter (dev builds and nightlies have none). ValueError when `version` is not a PEP 440 version.
    """
    if _parse_pep440(version) is None:
        raise ValueError(f"not a vLLM version: {version!r}")
    public = version.strip().split("+", 1)[0]
    return "v" + public.lstrip("vV")


def same_release(first: str, second: str) -> bool:
    """`0.32.0+cpu` and `0.32.0` are one release (the local label names the build), and so are `0.32` and
    `0.32.0` (PEP 440 equality); unreadable versions are compared as text."""
    parsed = _parse_pep440(first), _parse_pep440(second)
    if parsed[0] is None or parsed[1] is None:
        return first == second
    return parsed[0].key == parsed[1].key
