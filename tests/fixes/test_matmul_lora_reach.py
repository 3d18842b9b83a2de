"""matmul_lora's reach on the MoE and hybrid-GDN models of vLLM #48590 and #52568, re-checked on the sources
of every supported release (docs/fixes/matmul-lora.md, section "Reach").

The fix replaces one method, punica's `add_lora_linear` (its PATCHES). The threads show the Hopper NaN on
Qwen3.5/3.6 hybrid-GDN models, dense (#52568, through 0.28) and MoE (#48590's Qwen3.6-35B-A3B on 0.26, its
first NaN in a GDN layer, cured by a change to lora_expand, the kernel under `add_lora_linear`). What these
tests hold, on each release's own files:

(a) the models of the threads build their GDN layer from vLLM's Qwen GDN class, and that layer (with the
    full attention and the MoE shared expert beside it) builds its projections from the linear classes
    expected (in_proj_qkvz/in_proj_ba merged column-parallel, out_proj row-parallel) and calls them as
    modules, so their LoRA wrapper's forward is what runs;
(b) every LoRA wrapper vLLM would put on those classes (fully sharded ones aside) derives from
    BaseLinearLayerWithLoRA, and its forward reaches punica's `add_lora_linear` and no other punica kernel;
(c) that method is the one the fix patches (read from deploykit/fixes/matmul_lora.py), defined with the
    signature the fix expects on the wrapper class vLLM's CUDA platform names;
(d) routed-expert LoRA (add_lora_w13/add_lora_w2, into add_lora_fused_moe) and the fully sharded wrappers
    never reach it: the doc's "not covered" rows. A release that changes any of this fails here, and the
    message says what to revisit.

Everything is read with `ast`; nothing of vLLM is imported (0.33 and 0.34 are here only as the Python
sources of their CUDA wheels). The installed release (0.32, the CPU build) is located, not imported; any
other comes from tools/fetch-vllm-sources.sh through tools/vllm_tables.release_env, as tests/vllm_releases
finds it. Sources missing: the test fails under CI and skips elsewhere. The last tests change one source
string at a time and show each check failing on it.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import inspect
import os
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploykit.fixes import matmul_lora
from deploykit.vllm_tables import SUPPORTED_VLLM_RELEASES
from tests.vllm_releases.releases import importable_release, vllm_root
from tools import vllm_tables

# The architectures of the threads, as vLLM's model registry names them.
THREAD_ARCHITECTURES = {
    "Qwen3_5MoeForConditionalGeneration": "#48590: Qwen3.6-35B-A3B, MoE + hybrid GDN",
    "Qwen3_5ForConditionalGeneration": "#52568: Qwen3.5-9B, dense hybrid GDN",
    "Qwen3NextForCausalLM": "Qwen3-Next, the Qwen GDN layer's first user",
}
REGISTRY_FILE = "vllm/model_executor/models/registry.py"
GDN_MODULE = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
GDN_FILE = GDN_MODULE.replace(".", "/") + ".py"
GDN_CLASS = "QwenGatedDeltaNetAttention"
ATTENTION_CLASS = "Qwen3NextAttention"
QWEN3_NEXT_FILE = "vllm/model_executor/models/qwen3_next.py"
# What the decoder layers of the threads' models build (in the file that defines the architecture).
MODEL_LAYERS = {"linear_attn": GDN_CLASS, "self_attn": ATTENTION_CLASS}
LINEAR_FILE = "vllm/model_executor/layers/linear.py"
LORA_LAYERS = "vllm/lora/layers"
LORA_REGISTRY_FILE = "vllm/lora/utils.py"
BASE_LINEAR_LORA = "BaseLinearLayerWithLoRA"
FULLY_SHARDED_ONLY = "_fully_sharded_can_replace"  # can_replace_layer's decorator: --fully-sharded-loras only
CUDA_PLATFORM_FILE = "vllm/platforms/cuda.py"
MOE_LORA_FILE = "vllm/lora/layers/fused_moe.py"
EXPERTS_MIXIN_FILE = "vllm/model_executor/layers/fused_moe/experts/lora_experts_mixin.py"
FUSED_MOE_FOLDER = "vllm/model_executor/layers/fused_moe"
ROUTED_EXPERT_CALLS = frozenset({"add_lora_w13", "add_lora_w2"})
ROUTED_EXPERT_KERNEL = "add_lora_fused_moe"
# Reading a projection's weights or quant method in the layer's forward would compute without its LoRA.
BYPASSING_ATTRIBUTES = frozenset({"weight", "quant_method"})


@dataclass(frozen=True)
class Layer:
    """A layer class of the threads' models; the linear class each projection is (or derives from)."""

    what: str
    file: str
    name: str
    projections: tuple[tuple[str, str], ...]


LAYERS = (
    Layer(
        "GDN linear attention",
        GDN_FILE,
        GDN_CLASS,
        (
            ("in_proj_qkvz", "MergedColumnParallelLinear"),
            ("in_proj_ba", "MergedColumnParallelLinear"),
            ("out_proj", "RowParallelLinear"),
        ),
    ),
    Layer(
        "full attention",
        QWEN3_NEXT_FILE,
        ATTENTION_CLASS,
        (("qkv_proj", "QKVParallelLinear"), ("o_proj", "RowParallelLinear")),
    ),
    Layer(
        "MoE shared expert",
        "vllm/model_executor/models/qwen2_moe.py",
        "Qwen2MoeMLP",
        (("gate_up_proj", "MergedColumnParallelLinear"), ("down_proj", "RowParallelLinear")),
    ),
)
# Qwen3NextSparseMoeBlock's shared expert is that MLP (imported as Qwen3NextMLP).
SHARED_EXPERT = (QWEN3_NEXT_FILE, "Qwen3NextSparseMoeBlock", "shared_expert", "Qwen2MoeMLP")


# The method the fix replaces, as its PATCHES names it (the test below holds patch_wrapper_class to it).
TARGET = matmul_lora.PATCHES.rpartition(".")[2]


def methods_patch_wrapper_class_replaces() -> set[str]:
    """The attributes deploykit's patch_wrapper_class sets on the wrapper class, its constructor aside."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(matmul_lora.patch_wrapper_class)))
    assigned = {
        target.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "cls"
    }
    return assigned - {"__init__"}


# --- a release's sources --------------------------------------------------------------------------------


@functools.cache
def _release_root(release: str) -> Path:
    if release == importable_release():
        return vllm_root()
    env = vllm_tables.release_env(release)  # RuntimeError: the sources could not be fetched or unpacked
    return Path(env["PYTHONPATH"].split(os.pathsep)[0])


class Sources:
    """One release's Python files under the folder holding its `vllm/`, some maybe replaced by other text."""

    def __init__(self, root: Path, replaced: Mapping[str, str] | None = None) -> None:
        self.root = root
        self.replaced = dict(replaced or {})

    def exists(self, relative: str) -> bool:
        return relative in self.replaced or (self.root / relative).is_file()

    def text(self, relative: str) -> str:
        if relative in self.replaced:
            return self.replaced[relative]
        return (self.root / relative).read_text(encoding="utf-8")

    def tree(self, relative: str) -> ast.Module:
        return _parse(self.text(relative))

    def python_files(self, folder: str) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in (self.root / folder).rglob("*.py"))

    def changed(self, relative: str, old: str, new: str) -> Sources:
        text = self.text(relative)
        assert old in text, f"{relative} no longer holds {old!r}: update the mutation"
        return Sources(self.root, {**self.replaced, relative: text.replace(old, new)})


@functools.lru_cache(maxsize=256)
def _parse(text: str) -> ast.Module:
    return ast.parse(text)


def sources_of(release: str) -> Sources:
    try:
        return Sources(_release_root(release))
    except RuntimeError as exc:  # the sources could not be fetched (offline) or unpacked
        if os.environ.get("CI"):
            raise
        pytest.skip(f"vLLM {release}'s sources are not available here: {exc}")


def installed_sources() -> Sources:
    release = importable_release()
    if release is None:
        if os.environ.get("CI"):
            pytest.fail("no supported vLLM release is installed: CI installs the CPU build")
        pytest.skip("no supported vLLM release is installed")
    return sources_of(release)


# --- classes, methods and calls, from the syntax tree ---------------------------------------------------


@dataclass(frozen=True)
class ClassInfo:
    name: str
    bases: tuple[str, ...]
    file: str
    methods: Mapping[str, ast.FunctionDef]


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ast.unparse(node)


def classes_in(sources: Sources, files: list[str]) -> dict[str, ClassInfo]:
    found: dict[str, ClassInfo] = {}
    for relative in files:
        for node in ast.walk(sources.tree(relative)):
            if isinstance(node, ast.ClassDef):
                methods = {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
                found[node.name] = ClassInfo(node.name, tuple(map(_name, node.bases)), relative, methods)
    return found


def module_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """Every function not in a class body (those under a module-level `if` included)."""
    found: dict[str, ast.FunctionDef] = {}
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.ClassDef):
            continue
        if isinstance(node, ast.FunctionDef):
            found.setdefault(node.name, node)
        pending.extend(ast.iter_child_nodes(node))
    return found


def mro(classes: Mapping[str, ClassInfo], name: str) -> list[str]:
    """C3 over the classes known; an unknown base ends its line."""
    info = classes.get(name)
    if info is None:
        return [name]
    lines = [mro(classes, base) for base in info.bases] + [list(info.bases)]
    order = [name]
    while lines := [line for line in lines if line]:
        head = next((line[0] for line in lines if not any(line[0] in other[1:] for other in lines)), None)
        if head is None:
            raise AssertionError(f"no method resolution order for {name}")
        order.append(head)
        lines = [line[1:] if line[0] == head else line for line in lines]
    return order


def resolve(
    classes: Mapping[str, ClassInfo], cls: str, method: str, after: str | None = None
) -> tuple[str, ast.FunctionDef] | None:
    order = mro(classes, cls)
    if after is not None and after in order:
        order = order[order.index(after) + 1 :]
    for owner in order:
        if owner in classes and method in classes[owner].methods:
            return owner, classes[owner].methods[method]
    return None


def _is_super(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def punica_calls(node: ast.AST) -> set[str]:
    """`<anything>.punica_wrapper.<method>(...)` in `node`."""
    return {
        call.func.attr
        for call in ast.walk(node)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Attribute)
        and call.func.value.attr == "punica_wrapper"
    }


@dataclass(frozen=True)
class Reach:
    punica: frozenset[str]  # punica wrapper methods called
    methods: frozenset[str]  # the class's own methods followed


def reach(
    classes: Mapping[str, ClassInfo],
    functions: Mapping[str, Mapping[str, ast.FunctionDef]],
    cls: str,
    entry: str,
) -> Reach:
    """What `cls.<entry>` calls, following `self.m()`, `super().m()`, module functions of the file it runs
    in, and `torch.ops.vllm.<op>(...)` into the function of that name (vLLM registers a layer's custom op
    with it; its body fetches the layer as `self`)."""
    punica: set[str] = set()
    followed: set[str] = set()
    seen: set[int] = set()
    start = resolve(classes, cls, entry)
    pending = [(owner, classes[owner].file, fn) for owner, fn in [start] if start is not None]
    while pending:
        owner, file, fn = pending.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        followed.add(fn.name)
        punica |= punica_calls(fn)
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            func = call.func
            method: tuple[str, ast.FunctionDef] | None = None
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "self"
            ):
                method = resolve(classes, cls, func.attr)
            elif isinstance(func, ast.Attribute) and _is_super(func.value):
                method = resolve(classes, cls, func.attr, after=owner)
            elif isinstance(func, ast.Attribute) and ast.unparse(func.value) == "torch.ops.vllm":
                where = next((f for f, defined in functions.items() if func.attr in defined), None)
                if where is not None:
                    pending.append((owner, where, functions[where][func.attr]))
            elif isinstance(func, ast.Name) and func.id in functions.get(file, {}):
                pending.append((owner, file, functions[file][func.id]))
            if method is not None:
                pending.append((method[0], classes[method[0]].file, method[1]))
    return Reach(frozenset(punica), frozenset(followed))


def imported_as(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """Local name -> (module, name) for every `from module import name [as local]` (absolute only)."""
    return {
        alias.asname or alias.name: (node.module or "", alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0
        for alias in node.names
    }


def built_with(sources: Sources, relative: str, attr: str, class_name: str | None = None) -> set[str]:
    """The classes `self.<attr> = ...` builds in `relative` (in `class_name` only, when given), import
    aliases undone, through a factory method of the class (`self.create_x(...)`, its `return X(...)`);
    anything else is kept as its source text, so that it matches no class. `= None` is not a build."""
    tree = sources.tree(relative)
    aliases = imported_as(tree)
    classes = classes_in(sources, [relative])
    built: set[str] = set()

    def called(value: ast.expr, owner: str) -> set[str]:
        if not isinstance(value, ast.Call):
            return {ast.unparse(value)}
        func = value.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            factory = resolve(classes, owner, func.attr)
            if factory is None:
                return {ast.unparse(func)}
            returned = [n.value for n in ast.walk(factory[1]) if isinstance(n, ast.Return) and n.value]
            return set().union(*(called(v, owner) for v in returned)) if returned else {ast.unparse(func)}
        name = _name(func)
        return {aliases.get(name, ("", name))[1]}

    for info in classes.values():
        if class_name is not None and info.name != class_name:
            continue
        for method in info.methods.values():
            for node in ast.walk(method):
                if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                is_none = isinstance(node.value, ast.Constant) and node.value.value is None
                if any(_is_self_attr(t, attr) for t in targets) and not is_none:
                    built |= called(node.value, info.name)
    return built


def _is_self_attr(node: ast.AST, attr: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attr
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


# --- (a) the models and their layers ----------------------------------------------------------------------


def registry_module(sources: Sources, architecture: str) -> str | None:
    for node in ast.walk(sources.tree(REGISTRY_FILE)):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and key.value == architecture
                    and isinstance(value, ast.Tuple)
                    and isinstance(value.elts[0], ast.Constant)
                ):
                    module = str(value.elts[0].value)
                    return module if module.startswith("vllm.") else f"vllm.model_executor.models.{module}"
    return None


def module_file(sources: Sources, module: str) -> str | None:
    base = module.replace(".", "/")
    return next((f for f in (f"{base}.py", f"{base}/__init__.py") if sources.exists(f)), None)


def defining_files(sources: Sources, module: str, name: str, depth: int = 0) -> list[str]:
    """The files that define class `name`, from `module` through its re-exports (vLLM 0.34's
    `vllm.models.qwen3_5` imports the CUDA model or the generic one, by platform: both are followed)."""
    relative = module_file(sources, module)
    if relative is None or depth > 4:
        return []
    tree = sources.tree(relative)
    if any(isinstance(n, ast.ClassDef) and n.name == name for n in ast.walk(tree)):
        return [relative]
    package = module if relative.endswith("__init__.py") else module.rpartition(".")[0]
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(alias.name == name for alias in node.names):
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{anchor}.{node.module}" if node.module else anchor
            else:
                source = node.module or ""
            found += [f for f in defining_files(sources, source, name, depth + 1) if f not in found]
    return found


def model_problems(sources: Sources) -> list[str]:
    """The threads' architectures build their decoder layers' GDN and attention from the shared classes."""
    problems: list[str] = []
    for architecture, thread in THREAD_ARCHITECTURES.items():
        module = registry_module(sources, architecture)
        files = defining_files(sources, module, architecture) if module else []
        if not files:
            problems.append(f"{architecture} ({thread}): not found through {REGISTRY_FILE}")
        for relative in files:
            for attr, expected in MODEL_LAYERS.items():
                built = built_with(sources, relative, attr)
                if built != {expected}:
                    problems.append(
                        f"{architecture} ({thread}), {relative}: self.{attr} built with {sorted(built)}, "
                        f"not {expected}: revisit the layers below for the class it uses"
                    )
            if imported_as(sources.tree(relative)).get(GDN_CLASS) != (GDN_MODULE, GDN_CLASS):
                problems.append(f"{relative}: {GDN_CLASS} is not {GDN_MODULE}'s")
    return problems


def linear_classes(sources: Sources) -> dict[str, ClassInfo]:
    return classes_in(sources, [LINEAR_FILE])


def projection_classes(sources: Sources) -> dict[tuple[str, str], set[str]]:
    """(layer class, projection) -> the classes the release builds it with."""
    return {
        (layer.name, attr): built_with(sources, layer.file, attr, layer.name)
        for layer in LAYERS
        for attr, _ in layer.projections
    }


def layer_problems(sources: Sources) -> list[str]:
    """Each projection is built from the linear class expected (or a subclass), and the layer calls it as a
    module, never reaching into its weights: the LoRA wrapper that replaces it is what computes."""
    linear = linear_classes(sources)
    built = projection_classes(sources)
    problems: list[str] = []
    for layer in LAYERS:
        methods = classes_in(sources, [layer.file]).get(layer.name)
        if methods is None:
            problems.append(f"{layer.what}: no class {layer.name} in {layer.file}")
            continue
        for attr, expected in layer.projections:
            classes = built[layer.name, attr]
            if not classes:
                problems.append(f"{layer.what} ({layer.name}): self.{attr} is not built in {layer.file}")
            for cls in sorted(classes):
                if expected not in mro(linear, cls):
                    problems.append(
                        f"{layer.what} ({layer.name}): self.{attr} built with {cls}, not a {expected} "
                        f"({LINEAR_FILE})"
                    )
            problems += module_use_problems(layer, methods, attr)
    file, owner, attr, expected = SHARED_EXPERT
    if built_with(sources, file, attr, owner) != {expected}:
        problems.append(f"{owner}.{attr} is not built with {expected} in {file}")
    return problems


def module_use_problems(layer: Layer, info: ClassInfo, attr: str) -> list[str]:
    """The layer calls `self.<attr>(...)` outside __init__ and never reads its weight or quant method or
    calls a method of it there: what runs is the module, i.e. the LoRA wrapper once vLLM has put one on."""
    calls = 0
    bypasses: list[str] = []
    for name, method in info.methods.items():
        if name == "__init__":
            continue
        for node in ast.walk(method):
            if isinstance(node, ast.Call) and _is_self_attr(node.func, attr):
                calls += 1
            elif (
                isinstance(node, ast.Attribute)
                and _is_self_attr(node.value, attr)
                and (
                    node.attr in BYPASSING_ATTRIBUTES
                    or _is_method_call(_parent_call(method, node), node.attr)
                )
            ):
                bypasses.append(f"{name}: {ast.unparse(node)} (line {node.lineno})")
    problems = []
    if calls == 0:
        problems.append(f"{layer.what} ({layer.name}) never calls self.{attr}(...) outside __init__")
    if bypasses:
        problems.append(f"{layer.what} ({layer.name}) reaches into self.{attr}: {'; '.join(bypasses)}")
    return problems


def _parent_call(tree: ast.AST, func: ast.AST) -> ast.AST | None:
    """The call whose callee is `func`, if any."""
    return next((n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.func is func), None)


# --- (b) their LoRA wrappers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wrapper:
    name: str
    fully_sharded_only: bool
    linear: bool  # derives from BaseLinearLayerWithLoRA
    reach: Reach


class Lora:
    """vLLM's LoRA layer wrappers (vllm/lora/layers) and the ones it registers (vllm/lora/utils.py)."""

    def __init__(self, sources: Sources) -> None:
        files = sources.python_files(LORA_LAYERS)
        self.classes = classes_in(sources, files)
        self.functions = {f: module_functions(sources.tree(f)) for f in files}
        self.registered = registered_wrappers(sources)
        self.linear = linear_classes(sources)

    def wrapper(self, name: str) -> Wrapper:
        found = resolve(self.classes, name, "can_replace_layer")
        sharded = found is not None and any(_name(d) == FULLY_SHARDED_ONLY for d in found[1].decorator_list)
        linear = BASE_LINEAR_LORA in mro(self.classes, name)
        return Wrapper(name, sharded, linear, reach(self.classes, self.functions, name, "forward"))

    def mentions(self, name: str, after: str | None = None) -> set[str]:
        """The names and strings `can_replace_layer` of `name` tests layers against, through super()."""
        found = resolve(self.classes, name, "can_replace_layer", after)
        if found is None:
            return set()
        owner, fn = found
        named = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
        named |= {n.value for n in ast.walk(fn) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        if any(_is_super(n.func.value) for n in ast.walk(fn) if _is_method_call(n, "can_replace_layer")):
            named |= self.mentions(name, after=owner)
        return named

    def wrappers_of(self, layer_class: str) -> list[Wrapper]:
        """The registered wrappers whose can_replace_layer names the class or a class it derives from: every
        one vLLM may put on it (a superset: a test of `type(layer) is Base` is counted too)."""
        lineage = set(mro(self.linear, layer_class))
        return [self.wrapper(n) for n in self.registered if n in self.classes and self.mentions(n) & lineage]


def _is_method_call(node: ast.AST | None, method: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method


def registered_wrappers(sources: Sources) -> list[str]:
    for node in ast.walk(sources.tree(LORA_REGISTRY_FILE)):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == "_all_lora_classes" for t in targets):
            value = node.value
            if isinstance(value, ast.Tuple | ast.List | ast.Set):
                return [_name(e) for e in value.elts]
    raise AssertionError(f"no _all_lora_classes in {LORA_REGISTRY_FILE}")


def wrapper_problems(sources: Sources, target: str) -> list[str]:
    """Every wrapper vLLM may put on a projection of the layers above (fully sharded ones aside) derives
    from BaseLinearLayerWithLoRA and its forward reaches punica's `target`, and no other punica method."""
    lora = Lora(sources)
    problems = [
        f"{LORA_REGISTRY_FILE} registers {name}, not defined under {LORA_LAYERS}: cannot tell what it wraps"
        for name in lora.registered
        if name not in lora.classes
    ]
    for (owner, attr), built in sorted(projection_classes(sources).items()):
        for layer_class in sorted(built):
            wrappers = [w for w in lora.wrappers_of(layer_class) if not w.fully_sharded_only]
            if not wrappers:
                problems.append(f"{owner}.{attr} ({layer_class}): no LoRA wrapper replaces it")
            for w in wrappers:
                if not w.linear:
                    problems.append(
                        f"{owner}.{attr} ({layer_class}): its wrapper {w.name} does not derive from "
                        f"{BASE_LINEAR_LORA}"
                    )
                if w.reach.punica != {target}:
                    problems.append(
                        f"{owner}.{attr} ({layer_class}): its wrapper {w.name}'s forward reaches punica's "
                        f"{sorted(w.reach.punica)}, not {target} alone"
                    )
    return problems


# --- (c) the fix's target ----------------------------------------------------------------------------------


def cuda_wrapper(sources: Sources) -> tuple[str, str]:
    """(file, class) of the punica wrapper vLLM's CUDA platform names (`get_punica_wrapper`)."""
    platform = classes_in(sources, [CUDA_PLATFORM_FILE])
    for info in platform.values():
        method = info.methods.get("get_punica_wrapper")
        if method is not None:
            returned = [n.value for n in ast.walk(method) if isinstance(n, ast.Return)]
            if len(returned) == 1 and isinstance(returned[0], ast.Constant):
                module, _, name = str(returned[0].value).rpartition(".")
                relative = module_file(sources, module)
                assert relative is not None, f"{CUDA_PLATFORM_FILE} names {module}, which is not there"
                return relative, name
    raise AssertionError(f"{CUDA_PLATFORM_FILE}: no get_punica_wrapper returning one class name")


def target_problems(sources: Sources, target: str) -> list[str]:
    """PATCHES' pattern matches the CUDA wrapper; it defines `target` with the signature the fix expects."""
    relative, name = cuda_wrapper(sources)
    module_pattern, _, class_pattern = matmul_lora.PATCHES.partition(": ")
    problems = []
    module = relative.removesuffix(".py").replace("/", ".")
    if not module.startswith(module_pattern) or not fnmatch.fnmatch(f"{name}.{target}", class_pattern):
        problems.append(f"the CUDA wrapper {module}.{name} is not what PATCHES ({matmul_lora.PATCHES}) names")
    method = classes_in(sources, [relative]).get(name, ClassInfo(name, (), relative, {})).methods.get(target)
    if method is None:
        return [*problems, f"{module}.{name} defines no {target}"]
    positional = tuple(a.arg for a in method.args.args)
    keyword_only = tuple(a.arg for a in method.args.kwonlyargs)
    if positional != matmul_lora.EXPECTED_POSITIONAL or keyword_only != matmul_lora.EXPECTED_KEYWORD_ONLY:
        problems.append(f"{module}.{name}.{target}{positional}, keyword-only {keyword_only}")
    return problems


# --- (d) what the fix does not reach ----------------------------------------------------------------------


def calls_of(tree: ast.AST, method: str) -> list[int]:
    return [n.lineno for n in ast.walk(tree) if _is_method_call(n, method)]


def not_covered_problems(sources: Sources, target: str) -> list[str]:
    """Routed-expert LoRA goes add_lora_w13/add_lora_w2 -> add_lora_fused_moe, and the fully sharded
    wrappers call punica's shrink/expand: none of them reaches `target`."""
    revisit = REVISIT
    problems: list[str] = []
    lora = Lora(sources)
    for name, info in lora.classes.items():
        if info.file == MOE_LORA_FILE and BASE_LINEAR_LORA in mro(lora.classes, name):
            problems.append(f"{MOE_LORA_FILE}: {name} derives from {BASE_LINEAR_LORA}: {revisit}")
    if lines := calls_of(sources.tree(MOE_LORA_FILE), target):
        problems.append(f"{MOE_LORA_FILE} calls {target} (lines {lines}): {revisit}")
    if not sources.exists(EXPERTS_MIXIN_FILE):
        problems.append(f"{EXPERTS_MIXIN_FILE} is gone: find where routed-expert LoRA calls punica now")
    else:
        called = punica_calls(sources.tree(EXPERTS_MIXIN_FILE))
        if called != ROUTED_EXPERT_CALLS:
            problems.append(
                f"{EXPERTS_MIXIN_FILE}: the experts' LoRA calls punica's {sorted(called)}, "
                f"not {sorted(ROUTED_EXPERT_CALLS)}: {revisit}"
            )
    for relative in sources.python_files(FUSED_MOE_FOLDER):
        text = sources.text(relative)
        if target in text and (lines := calls_of(sources.tree(relative), target)):
            problems.append(f"{relative} calls {target} (lines {lines}): {revisit}")
    relative, name = cuda_wrapper(sources)
    punica = classes_in(sources, [relative])
    for entry in sorted(ROUTED_EXPERT_CALLS):
        followed = reach(punica, {relative: module_functions(sources.tree(relative))}, name, entry).methods
        if ROUTED_EXPERT_KERNEL not in followed or target in followed:
            problems.append(f"{name}.{entry} runs {sorted(followed)}: {revisit}")
    sharded = [
        w for w in map(lora.wrapper, lora.registered) if w.name in lora.classes and w.fully_sharded_only
    ]
    if not sharded:
        problems.append(f"no wrapper of {LORA_LAYERS} is for --fully-sharded-loras only: {revisit}")
    for w in sharded:
        if target in w.reach.punica or not w.reach.punica:
            problems.append(
                f"{w.name} (--fully-sharded-loras) reaches punica's {sorted(w.reach.punica)}: {revisit}"
            )
    return problems


# --- the tests, on each supported release ------------------------------------------------------------------

CHECKS: dict[str, Callable[[Sources], list[str]]] = {
    "models": model_problems,
    "layers": layer_problems,
    "wrappers": lambda s: wrapper_problems(s, TARGET),
    "target": lambda s: target_problems(s, TARGET),
    "not_covered": lambda s: not_covered_problems(s, TARGET),
}


def test_patches_names_the_one_method_the_fix_replaces() -> None:
    assert methods_patch_wrapper_class_replaces() == {TARGET}, matmul_lora.PATCHES


@pytest.mark.parametrize("release", SUPPORTED_VLLM_RELEASES)
def test_the_threads_models_build_their_gdn_and_attention_from_the_shared_layers(release: str) -> None:
    assert model_problems(sources_of(release)) == []


@pytest.mark.parametrize("release", SUPPORTED_VLLM_RELEASES)
def test_the_gdn_attention_and_shared_expert_projections_are_the_linear_classes_expected(
    release: str,
) -> None:
    sources = sources_of(release)
    assert layer_problems(sources) == []
    built = projection_classes(sources)
    assert built[GDN_CLASS, "out_proj"] == {"RowParallelLinear"}, built


@pytest.mark.parametrize("release", SUPPORTED_VLLM_RELEASES)
def test_their_lora_wrappers_reach_add_lora_linear_and_no_other_punica_kernel(release: str) -> None:
    sources = sources_of(release)
    assert wrapper_problems(sources, TARGET) == []
    lora = Lora(sources)
    names = {w.name for w in lora.wrappers_of("RowParallelLinear") if not w.fully_sharded_only}
    assert "RowParallelLinearWithLoRA" in names  # the wrapper of the GDN out_proj, found at all
    followed = lora.wrapper("RowParallelLinearWithLoRA").reach.methods
    assert {"_apply_lora_to_output", "_apply_async_impl"} <= followed  # the sync and dual-stream paths


@pytest.mark.parametrize("release", SUPPORTED_VLLM_RELEASES)
def test_add_lora_linear_is_what_the_fix_patches_on_the_cuda_wrapper(release: str) -> None:
    sources = sources_of(release)
    assert target_problems(sources, TARGET) == []
    assert cuda_wrapper(sources)[1] == matmul_lora.GPU_WRAPPER_CLASS


@pytest.mark.parametrize("release", SUPPORTED_VLLM_RELEASES)
def test_routed_expert_and_fully_sharded_lora_do_not_reach_it(release: str) -> None:
    assert not_covered_problems(sources_of(release), TARGET) == []


# --- each check fails on a source changed the way it guards against ----------------------------------------

ROW_WRAPPER_FILE = f"{LORA_LAYERS}/row_parallel_linear.py"
# A row-parallel class of its own for the GDN out_proj, with a LoRA wrapper that runs punica's shrink and
# expand itself (as the fully sharded wrappers do) instead of add_lora_linear.
FUSED_ROW_CLASS = "\n\nclass FusedRowParallelLinear(RowParallelLinear):\n    pass\n"
FUSED_ROW_WRAPPER = """

class FusedRowParallelLinearWithLoRA(BaseLayerWithLoRA):
    @classmethod
    def can_replace_layer(cls, source_layer, lora_config, packed_modules_list, model_config=None):
        return type(source_layer) is FusedRowParallelLinear

    def forward(self, input_):
        buffer = self.punica_wrapper.add_shrink(None, input_, self.lora_a_stacked, 1.0)
        return self.punica_wrapper.add_expand(input_, buffer, self.lora_b_stacked, self.output_slices)
"""


def _out_proj_with_its_own_wrapper(sources: Sources) -> Sources:
    changed = sources.changed(
        GDN_FILE, "self.out_proj = RowParallelLinear(", "self.out_proj = FusedRowParallelLinear("
    )
    changed = changed.changed(
        LINEAR_FILE, "\nclass RowParallelLinear(", FUSED_ROW_CLASS + "\nclass RowParallelLinear("
    )
    changed = changed.changed(
        ROW_WRAPPER_FILE,
        "\nclass RowParallelLinearWithLoRA(",
        FUSED_ROW_WRAPPER + "\nclass RowParallelLinearWithLoRA(",
    )
    first = registered_wrappers(sources)[0]
    return changed.changed(
        LORA_REGISTRY_FILE, f"    {first},\n", f"    FusedRowParallelLinearWithLoRA,\n    {first},\n"
    )


@dataclass(frozen=True)
class Mutation:
    what: str
    change: Callable[[Sources], Sources]
    check: str
    expected: tuple[str, ...]  # each in one of the problems the check reports


PUNICA_GPU_FILE = "vllm/lora/punica_wrapper/punica_gpu.py"
REVISIT = "revisit docs/fixes/matmul-lora.md's 'not covered' rows"
MUTATIONS = (
    Mutation(
        f"the GDN out_proj built with a class whose LoRA wrapper runs shrink/expand, not {TARGET}",
        _out_proj_with_its_own_wrapper,
        "wrappers",
        (
            f"{GDN_CLASS}.out_proj (FusedRowParallelLinear): its wrapper FusedRowParallelLinearWithLoRA's "
            f"forward reaches punica's ['add_expand', 'add_shrink'], not {TARGET} alone",
            f"its wrapper FusedRowParallelLinearWithLoRA does not derive from {BASE_LINEAR_LORA}",
        ),
    ),
    Mutation(
        "the GDN out_proj built with a class no LoRA wrapper replaces",
        lambda s: s.changed(GDN_FILE, "self.out_proj = RowParallelLinear(", "self.out_proj = nn.Linear("),
        "wrappers",
        (f"{GDN_CLASS}.out_proj (Linear): no LoRA wrapper replaces it",),
    ),
    Mutation(
        "the GDN out_proj built with a column-parallel class",
        lambda s: s.changed(
            GDN_FILE, "self.out_proj = RowParallelLinear(", "self.out_proj = ColumnParallelLinear("
        ),
        "layers",
        ("self.out_proj built with ColumnParallelLinear, not a RowParallelLinear",),
    ),
    Mutation(
        "the GDN forward computing out_proj from its weight",
        lambda s: s.changed(
            GDN_FILE, "self.out_proj(core_attn_out", "torch.matmul(self.out_proj.weight, core_attn_out"
        ),
        "layers",
        ("reaches into self.out_proj: ", "never calls self.out_proj(...)"),
    ),
    Mutation(
        "the GDN forward calling a method of out_proj",
        lambda s: s.changed(
            GDN_FILE, "self.out_proj(core_attn_out", "self.out_proj.forward_native(core_attn_out"
        ),
        "layers",
        ("reaches into self.out_proj: ",),
    ),
    Mutation(
        "the linear LoRA wrappers' shared path calling another punica method",
        lambda s: s.changed(
            f"{LORA_LAYERS}/base_linear.py",
            f"self.punica_wrapper.{TARGET}(\n            output,",
            f"self.punica_wrapper.{TARGET}_fused(\n            output,",
        ),
        "wrappers",
        (
            f"{GDN_CLASS}.out_proj (RowParallelLinear): its wrapper RowParallelLinearWithLoRA's forward "
            f"reaches punica's ['{TARGET}', '{TARGET}_fused'], not {TARGET} alone",
        ),
    ),
    Mutation(
        "the Qwen3.5 model building another GDN class",
        lambda s: s.changed(
            "vllm/model_executor/models/qwen3_5.py",
            f"self.linear_attn = {GDN_CLASS}(",
            "self.linear_attn = Qwen3_5GatedDeltaNet(",
        ),
        "models",
        (
            "Qwen3_5MoeForConditionalGeneration (#48590: Qwen3.6-35B-A3B, MoE + hybrid GDN), "
            f"vllm/model_executor/models/qwen3_5.py: self.linear_attn built with ['Qwen3_5GatedDeltaNet'], "
            f"not {GDN_CLASS}",
        ),
    ),
    Mutation(
        f"routed-expert LoRA calling {TARGET}",
        lambda s: s.changed(
            EXPERTS_MIXIN_FILE,
            "lora_context.punica_wrapper.add_lora_w2(",
            f"lora_context.punica_wrapper.{TARGET}(",
        ),
        "not_covered",
        (
            f"the experts' LoRA calls punica's ['{TARGET}', 'add_lora_w13'], not ['add_lora_w13', "
            f"'add_lora_w2']: {REVISIT}",
        ),
    ),
    Mutation(
        f"the CUDA wrapper's routed-expert methods handing off to {TARGET}",
        lambda s: s.changed(PUNICA_GPU_FILE, f"self.{ROUTED_EXPERT_KERNEL}(", f"self.{TARGET}("),
        "not_covered",
        ("PunicaWrapperGPU.add_lora_w13 runs", "PunicaWrapperGPU.add_lora_w2 runs"),
    ),
    Mutation(
        f"a fully sharded wrapper calling {TARGET}",
        lambda s: s.changed(
            ROW_WRAPPER_FILE, "self.punica_wrapper.add_expand(", f"self.punica_wrapper.{TARGET}("
        ),
        "not_covered",
        (
            "RowParallelLinearWithShardedLoRA (--fully-sharded-loras) reaches punica's "
            f"['{TARGET}', 'add_shrink']",
        ),
    ),
    Mutation(
        f"the CUDA wrapper's {TARGET} with another signature",
        lambda s: s.changed(
            PUNICA_GPU_FILE,
            f"    def {TARGET}(\n        self,\n        y:",
            f"    def {TARGET}(\n        self,\n        out:",
        ),
        "target",
        (f"PunicaWrapperGPU.{TARGET}('self', 'out',",),
    ),
)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.what)
def test_each_check_fails_on_a_source_changed_the_way_it_guards_against(mutation: Mutation) -> None:
    sources = installed_sources()
    check = CHECKS[mutation.check]
    assert check(sources) == []  # the control: the unchanged release passes
    problems = check(mutation.change(sources))
    for expected in mutation.expected:
        assert any(expected in problem for problem in problems), (expected, problems)
