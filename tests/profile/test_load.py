"""Profiles: every shipped profile loads; every broken profile is reported with file, line, column, field."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploykit.profile.load import list_profile_paths, load_profile, parse_profile, resolve_profile_path
from deploykit.profile.schema import ProfileError, SecretRef

REPO = Path(__file__).resolve().parents[2]
MINIMAL = "name: ok\nmodel:\n  source: /models/x\n"


@pytest.mark.parametrize("path", sorted((REPO / "profiles").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_profile_loads(path: Path) -> None:
    loaded = load_profile(str(path))
    assert loaded.profile.name == path.stem
    assert len(loaded.id) == 64


# (text, expected "LINE:COL: field" prefixes, a word the message must contain) — one case per kind of mistake.
BROKEN = [
    pytest.param("", ["1:1: (top level)"], "empty", id="empty-file"),
    pytest.param("# only a comment\n", ["1:1: (top level)"], "empty", id="comment-only"),
    pytest.param("name: x\nmodel: [unclosed\n", ["3:1: (yaml)"], "YAML syntax", id="yaml-syntax"),
    pytest.param("name: x\n  bad indent: 1\n", ["2:13: (yaml)"], "YAML syntax", id="yaml-indent"),
    pytest.param(MINIMAL + "name: again\n", ["4:1: name"], "duplicate key", id="duplicate-top-key"),
    pytest.param(
        MINIMAL + "serve:\n  port: 1\n  port: 2\n",
        ["6:3: serve.port"],
        "duplicate key",
        id="duplicate-nested-key",
    ),
    pytest.param("name: x\n", ["1:1: model"], "required", id="missing-model"),
    pytest.param(MINIMAL + "modle: {}\n", ["4:1: modle"], "unknown key", id="unknown-top-key"),
    pytest.param(
        MINIMAL + "serve:\n  max_model_len: lots\n", ["5:18: serve.max_model_len"], "integer", id="wrong-type"
    ),
    pytest.param(MINIMAL + "serve:\n  port: 70000\n", ["5:9: serve.port"], "65535", id="out-of-range"),
    pytest.param(
        MINIMAL + "fixes:\n  matmul_lora: maybe\n", ["5:16: fixes.matmul_lora"], "'auto'", id="bad-mode"
    ),
    pytest.param(
        MINIMAL + "fixes:\n  fp16_fix: on\n", ["5:3: fixes.fp16_fix"], "unknown key", id="unknown-fix"
    ),
    pytest.param(
        MINIMAL + "env:\n  HF_TOKEN: hf_abcdef\n",
        ["5:13: env.HF_TOKEN"],
        "looks like a secret",
        id="secret-in-env",
    ),
    pytest.param(
        MINIMAL + "requires:\n  architectures: [turing, pascall]\n",
        ["5:27: requires.architectures[1]"],
        "hopper",
        id="bad-arch-in-list",
    ),
    pytest.param(
        MINIMAL + "serve:\n  lora:\n    adapters: {a: /x}\n",
        ["5:3: serve.lora"],
        "enabled",
        id="adapters-without-lora",
    ),
    pytest.param(
        "name: Bad Name\nmodel:\n  source: builtin:giant\n",
        ["1:7: name", "3:11: model.source"],
        "pattern",
        id="two-errors-at-once",
    ),
    pytest.param(
        MINIMAL + "smoke:\n  cases:\n    - kind: completion\n    - kind: video\n",
        ["7:13: smoke.cases[1].kind"],
        "'completion'",
        id="bad-smoke-case",
    ),
    pytest.param(
        MINIMAL + "serve:\n  usage_stats: sometimes\n",
        ["5:16: serve.usage_stats"],
        "boolean",
        id="usage-stats",
    ),
    pytest.param(
        MINIMAL + "serve:\n  pipeline_parallel_size: 0\n",
        ["5:27: serve.pipeline_parallel_size"],
        "greater than or equal to 1",
        id="pipeline-parallel-zero",
    ),
    pytest.param(
        MINIMAL + "deploy:\n  nodes: true\n",
        ["5:10: deploy.nodes"],
        "boolean, not a number",
        id="nodes-boolean",
    ),
    pytest.param("- just\n- a list\n", ["1:1: (top level)"], "mapping", id="not-a-mapping"),
]


@pytest.mark.parametrize(("text", "locations", "word"), BROKEN)
def test_broken_profile_is_located(tmp_path: Path, text: str, locations: list[str], word: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))
    lines = [str(issue) for issue in caught.value.issues]
    for location in locations:
        assert any(line.startswith(f"{path}:{location}") for line in lines), lines
    assert any(word in line for line in lines), lines
    assert all(line.startswith(f"{path}:") for line in lines)


def test_all_errors_are_reported_not_only_the_first(tmp_path: Path) -> None:
    path = tmp_path / "many.yaml"
    path.write_text(
        MINIMAL + "serve:\n  port: 0\n  dtype: fp8\n  bogus: 1\nfixes:\n  matmul_lora: yes-please\n"
    )
    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))
    fields = [issue.field for issue in caught.value.issues]
    assert fields == ["serve.port", "serve.dtype", "serve.bogus", "fixes.matmul_lora"]


def test_missing_file_names_the_file() -> None:
    with pytest.raises(ProfileError) as caught:
        load_profile("/nonexistent/dir/nothing.yaml")
    assert str(caught.value).startswith("/nonexistent/dir/nothing.yaml:1:1: (file): no such profile file")


def test_bare_name_finds_the_shipped_profile_from_any_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DEPLOYKIT_PROFILE_DIR", str(tmp_path / "none"))
    assert resolve_profile_path("gemma4-turing") == REPO / "profiles" / "gemma4-turing.yaml"
    assert resolve_profile_path("gemma4-turing.yaml") == REPO / "profiles" / "gemma4-turing.yaml"
    assert load_profile("demo-cpu").profile.platform == "cpu"


def test_user_profile_dir_overrides_shipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "demo-cpu.yaml").write_text("name: demo-cpu\ndescription: mine\nmodel:\n  source: /m\n")
    monkeypatch.setenv("DEPLOYKIT_PROFILE_DIR", str(tmp_path))
    assert load_profile("demo-cpu").profile.description == "mine"
    listed = {p.name: p for p in list_profile_paths()}
    assert listed["demo-cpu.yaml"].parent == tmp_path
    assert "gemma4-turing.yaml" in listed


def test_profile_id_ignores_formatting_but_not_content() -> None:
    a = parse_profile("name: x\nmodel: {source: /m}\n# comment\n")
    b = parse_profile("model:\n  source: /m\nname: x\n")
    c = parse_profile("model:\n  source: /other\nname: x\n")
    assert a.profile_id() == b.profile_id()
    assert a.profile_id() != c.profile_id()


def test_profile_id_is_stable_across_the_advisories_field() -> None:
    """Rows stored before profiles could set advisories keep matching their profile's id."""
    plain = parse_profile("name: x\nmodel: {source: /m}\n")
    # computed at commit b7c9c34, before the `advisories` field existed (and serve.pipeline_parallel_size,
    # deploy.nodes: issue 44)
    assert plain.profile_id() == "2efc86bdf336dd545e2f9f0814f70f1dd7aed96a1d05e47f3af99f9560f7625e"
    base = "name: x\nmodel: {source: /m}\n"
    for later in (
        "advisories: {fp8-kv-deepseek-v3: ignore}\n",
        "serve: {count_nan_logits: false}\n",
        "serve: {usage_stats: true}\n",
        "smoke: {fingerprint: {top_k: 7}}\n",
        "serve: {pipeline_parallel_size: 2}\n",
        "deploy: {nodes: 2}\n",
    ):  # a later field set away from its default is part of the id
        assert parse_profile(base + later).profile_id() != plain.profile_id(), later


def test_secret_reference_is_accepted() -> None:
    profile = parse_profile(MINIMAL + "env:\n  HF_TOKEN: {secret: MY_HF_TOKEN}\n  LOG_LEVEL: debug\n")
    assert profile.env["HF_TOKEN"] == SecretRef(secret="MY_HF_TOKEN")
    assert profile.env["LOG_LEVEL"] == "debug"
