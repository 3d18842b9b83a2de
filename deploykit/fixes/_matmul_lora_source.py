"""Facts read from a vLLM release's source (with `ast`, never imported) that the matmul_lora rule needs
(deploykit/fixes/matmul_lora.py decide). The shipped file of each supported release records them
(tools/vllm_tables.py calls read_source_facts); tests/vllm_releases holds the record to each release's
source."""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Callable
from pathlib import Path

from deploykit.installed import installed_vllm_version

CPU_OPS_FILE = "vllm/lora/ops/torch_ops/lora_ops.py"
EXPAND_OP_FILE = "vllm/lora/ops/triton_ops/lora_expand_op.py"
CPU_OPS_MASK_NO_ADAPTER = "lora_cpu_ops_mask_no_adapter"
EXPAND_SM90_SINGLE_STAGE = "lora_expand_sm90_single_stage"
_CPU_OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")


def cpu_ops_mask_no_adapter(source: str) -> bool | None:
    """Do the torch LoRA ops (the CPU build's punica path) treat slot -1 as "no adapter"? True when each
    of bgmv_shrink/expand/expand_slice clamps the slot index before indexing the weight stack and masks the
    rows without an adapter (0.33); False when one indexes with the raw ids (0.32: -1 reads the last
    adapter). None when one of the functions is not in `source`."""
    functions = {node.name: node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)}
    if any(name not in functions for name in _CPU_OPS):
        return None
    for name in _CPU_OPS:
        called = {
            call.func.attr
            for call in ast.walk(functions[name])
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
        }
        if "clamp" not in called or not called & {"masked_fill", "where"}:
            return False
    return True


def expand_sm90_single_stage(source: str) -> bool | None:
    """Does lora_expand force one pipeline stage on compute capability 9.0 (vLLM 0.33's guard against
    triton-lang/triton#9433)? None when `source` assigns no NUM_STAGES at all."""
    tree = ast.parse(source)
    if not any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "NUM_STAGES" for t in node.targets)
        for node in ast.walk(tree)
    ):
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.If) or "is_device_capability(90)" not in ast.unparse(node.test):
            continue
        for statement in ast.walk(node):
            if (
                isinstance(statement, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "NUM_STAGES" for t in statement.targets)
                and isinstance(statement.value, ast.Constant)
                and statement.value.value == 1
            ):
                return True
    return False


SOURCE_FACTS: dict[str, tuple[str, Callable[[str], bool | None]]] = {
    CPU_OPS_MASK_NO_ADAPTER: (CPU_OPS_FILE, cpu_ops_mask_no_adapter),
    EXPAND_SM90_SINGLE_STAGE: (EXPAND_OP_FILE, expand_sm90_single_stage),
}


def read_source_facts(vllm_root: Path) -> dict[str, bool | None]:
    """SOURCE_FACTS of the vLLM whose files are under `vllm_root` (the folder that holds `vllm/`)."""
    facts: dict[str, bool | None] = {}
    for name, (relative, detector) in SOURCE_FACTS.items():
        try:
            facts[name] = detector((vllm_root / relative).read_text(encoding="utf-8"))
        except (OSError, SyntaxError):
            facts[name] = None
    return facts


def release_source_facts(vllm_version: str | None) -> dict[str, bool | None]:
    """SOURCE_FACTS of the vLLM a plan targets: the shipped record of its release, else (a release not
    shipped, installed here) read from the installed files without importing them, else {} (unknown)."""
    from deploykit.vllm_compat import same_release
    from deploykit.vllm_tables import shipped_source_facts

    shipped = shipped_source_facts(vllm_version)
    if shipped is not None:
        return {name: shipped.get(name) for name in SOURCE_FACTS}
    installed = installed_vllm_version()
    if not vllm_version or not installed or not same_release(vllm_version, installed):
        return {}
    spec = importlib.util.find_spec("vllm")  # a top-level package: located, not imported
    if spec is None or not spec.submodule_search_locations:
        return {}
    return read_source_facts(Path(next(iter(spec.submodule_search_locations))).parent)
