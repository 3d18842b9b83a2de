"""Import vLLM's pure-Python sources carried with the tree (`.gpu-carry/vllm`) where vLLM is not installed.

The GPU machine has torch, triton and transformers but no vLLM: `bench/gpu/prepare.sh` copies vLLM's `.py`
files (no compiled extensions) and a few pure-Python wheels into `.gpu-carry/`. `setup()` puts them first
on `sys.path` and answers imports of what is still missing with empty stand-in modules, so that the op
modules the kit calls (punica's Triton LoRA ops, the penalty functions, the Gemma4 Unified embedder) import.
Every stand-in is recorded: a step that touches one fails loudly (calling a stand-in raises) and its JSON
says which.

`simulate_bare=True` (the dry run) also hides the packages of this machine's virtualenv that the GPU
machine does not have, so the dry run imports the carried sources the way the device will.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CARRY = REPO / ".gpu-carry"

# Import names of what KINDS.md lists on the GPU image (the ones vLLM's import chain reaches), plus the
# standard library and what `prepare.sh` carries as wheels.
GPU_IMAGE_PACKAGES = frozenset(
    [
        "aiohappyeyeballs",
        "aiohttp",
        "aiosignal",
        "anyio",
        "attr",
        "attrs",
        "certifi",
        "charset_normalizer",
        "click",
        "cloudpickle",
        "cpuinfo",
        "cv2",
        "filelock",
        "frozenlist",
        "fsspec",
        "functorch",
        "h11",
        "hf_xet",
        "httpcore",
        "httpx",
        "huggingface_hub",
        "idna",
        "jinja2",
        "markupsafe",
        "mpmath",
        "multidict",
        "networkx",
        "numpy",
        "packaging",
        "PIL",
        "prometheus_client",
        "propcache",
        "psutil",
        "pynvml",
        "pytest",
        "_pytest",
        "py",
        "pluggy",
        "iniconfig",
        "regex",
        "requests",
        "rich",
        "markdown_it",
        "mdurl",
        "pygments",
        "safetensors",
        "sentencepiece",
        "setuptools",
        "pkg_resources",
        "_distutils_hack",
        "shellingham",
        "six",
        "sympy",
        "tiktoken",
        "tokenizers",
        "torch",
        "torchgen",
        "torchvision",
        "tqdm",
        "transformers",
        "triton",
        "typer",
        "typing_extensions",
        "urllib3",
        "uvloop",
        "yaml",
        "yarl",
        "accelerate",
        "sniffio",
        "tabulate",
        "annotated_doc",
        "zipp",
        "wrapt",
        "einops",
        "google",
        "jaraco",
        "backports",
        "importlib_metadata",
        "more_itertools",
    ]
)
# Carried as wheels by prepare.sh (pure Python, or binary wheels for CPython 3.12).
CARRIED_WHEELS = frozenset(
    [
        "pydantic",
        "pydantic_core",
        "annotated_types",
        "typing_inspection",
        "cachetools",
        "msgspec",
        "cbor2",
        "dill",
        "zmq",
        "pybase64",
        "platformdirs",
        "more_itertools",
        "openai",
        "jiter",
        "distro",
    ]
)
# Imported by vLLM's chain but never used by the kit: answered by stand-ins when absent.
STUBBABLE = frozenset(
    [
        "openai_harmony",
        "xgrammar",
        "llguidance",
        "tvm_ffi",
        "fastapi",
        "starlette",
        "email_validator",
        "python_multipart",
        "partial_json_parser",
        "pydantic_extra_types",
        "truststore",
        "httpcore2",
        "httpx2",
        "blake3",
        "gguf",
        "mistral_common",
        "lm_format_enforcer",
        "outlines_core",
        "compressed_tensors",
        "depyf",
        "einops",
        "watchfiles",
        "diskcache",
        "lark",
        "numba",
        "ray",
        "setproctitle",
        "py_cpuinfo",
        "pyzmq",
        "cbor2",
        "msgspec",
        "zmq",
        "dill",
        "pybase64",
        "cachetools",
        "more_itertools",
    ]
)


class _AnyMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __iter__(cls) -> Any:
        return iter(())


class _Anything(metaclass=_AnyMeta):
    """A stand-in value: any attribute, call, subscript or base-class use works at import time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __init_subclass__(cls, **kwargs: Any) -> None:
        pass

    def __class_getitem__(cls, item: Any) -> Any:
        return cls

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema  # a stand-in type in a pydantic model validates anything

        return core_schema.any_schema()

    def __getattr__(self, name: str) -> Any:
        return _Anything()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _Anything()

    def __getitem__(self, item: Any) -> Any:
        return _Anything()

    def __iter__(self) -> Any:
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __or__(self, other: Any) -> Any:
        return _Anything


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name[:1].isupper():
            return type(name, (_Anything,), {"__module__": self.__name__})
        return _Anything()


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """First on sys.path's finders: hides (simulate_bare) and stands in (STUBBABLE, compiled vLLM)."""

    def __init__(self, compiled: set[str], simulate_bare: bool, venv_roots: list[str]) -> None:
        self.compiled = compiled
        self.simulate_bare = simulate_bare
        self.venv_roots = venv_roots
        self.stubbed: list[str] = []
        self.hidden: set[str] = set()

    def _real_spec(self, fullname: str, path: Any) -> Any:
        sys.meta_path.remove(self)
        try:
            return importlib.machinery.PathFinder.find_spec(fullname, path)
        finally:
            sys.meta_path.insert(0, self)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        top = fullname.split(".")[0]
        if fullname in self.compiled or (top == "vllm" and fullname.rsplit(".", 1)[-1].startswith("_C")):
            return importlib.util.spec_from_loader(fullname, self)
        stub_parent = sys.modules.get(top)
        if isinstance(stub_parent, _StubModule):
            return importlib.util.spec_from_loader(fullname, self)
        if top in sys.builtin_module_names or top in sys.stdlib_module_names:
            return None
        real = self._real_spec(fullname, path)
        if real is not None and self.simulate_bare and "." not in fullname and self._hidden(top, real):
            self.hidden.add(top)
            if top not in STUBBABLE:
                raise ModuleNotFoundError(f"No module named {top!r} (hidden: not on the GPU image)", name=top)
            real = None
        if real is not None:
            return real if self.simulate_bare else None
        if top in STUBBABLE:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def _hidden(self, top: str, spec: Any) -> bool:
        origin = str(spec.origin or (list(spec.submodule_search_locations or []) or [""])[0])
        in_venv = any(origin.startswith(root) for root in self.venv_roots)
        return in_venv and top not in GPU_IMAGE_PACKAGES and top not in CARRIED_WHEELS

    def create_module(self, spec: Any) -> Any:
        module = _StubModule(spec.name)
        module.__path__ = []  # a package, so submodules stand in too
        return module

    def exec_module(self, module: Any) -> None:
        self.stubbed.append(module.__name__)


_FINDER: _Finder | None = None


def setup(simulate_bare: bool = False, carry: Path = CARRY) -> dict[str, Any]:
    """Make `import vllm...` work from the carried sources when vLLM is not installed; describe the result."""
    global _FINDER
    info: dict[str, Any] = {"carry": str(carry), "simulate_bare": simulate_bare}
    installed = importlib.util.find_spec("vllm")
    use_carry = (carry / "vllm" / "__init__.py").exists() and (simulate_bare or installed is None)
    if use_carry and str(carry) not in sys.path:
        sys.path.insert(0, str(carry))
    compiled_list = carry / "vllm-compiled.txt"
    compiled = set(compiled_list.read_text().split()) if compiled_list.exists() else set()
    venv_roots = [p for p in sys.path if "site-packages" in p and not p.startswith(str(carry))]
    if _FINDER is None:
        _FINDER = _Finder(compiled, simulate_bare, venv_roots if simulate_bare else [])
        sys.meta_path.insert(0, _FINDER)
        sys.modules.pop("vllm", None)
    version_file = carry / "vllm-version.txt"
    info["vllm_sources"] = "carried" if use_carry else ("installed" if installed else "missing")
    info["carried_vllm_version"] = version_file.read_text().strip() if version_file.exists() else None
    return info


def report() -> dict[str, Any]:
    """What stood in and what was hidden so far (call at the end of a step)."""
    vllm = sys.modules.get("vllm")
    return {
        "stubbed_modules": sorted(set(_FINDER.stubbed)) if _FINDER else [],
        "hidden_packages": sorted(_FINDER.hidden) if _FINDER else [],
        "vllm_file": getattr(vllm, "__file__", None),
        "vllm_version": getattr(vllm, "__version__", None),
    }
