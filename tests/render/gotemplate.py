"""A minimal interpreter for the subset of Helm's Go templates that deploykit's chart uses — for tests only.

No helm binary can be installed where these tests run, so the chart's templates are rendered here to check
the manifests against the Kubernetes schemas. To stay honest it implements only these constructs, with Go
`text/template` + Helm semantics, and raises `TemplateUnsupported` on anything else (so a chart change
that needs more cannot pass silently):

- `{{ PIPELINE }}` and the trim markers `{{- ` / ` -}}` (all adjacent whitespace, newlines included);
- operands `.`, `.A.B`, `$`, `$.A.B`, `$var`, `$var.A`, "string" and integer literals;
  a missing map key is an error here (Helm would print nothing);
- functions `toYaml` (keys sorted, trailing newline removed, as Helm), `nindent N`, `indent N`,
  `quote` (Go's %q); a pipeline passes its value as the last argument;
- `{{ if P }} … {{ else }} … {{ end }}` with Go truthiness (false, 0, nil, empty string/list/map are false);
- `{{ range P }}`, `{{ range $v := P }}`, `{{ range $k, $v := P }}` (maps in sorted key order, as Go);
- `{{/* comments */}}`.

Printing follows Go's `%v`: strings as they are, booleans as true/false, numbers as Helm's float64 values
print. Numbers of 1e6 and above (Helm prints them as 1e+06) and maps/lists (Go prints `map[...]`) are refused.
When helm is on PATH, tests/render/test_helm.py compares this interpreter's output with `helm template`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

_ACTION = re.compile(r"\{\{(- )?(.*?)( -)?\}\}", re.DOTALL)
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|:=|\||,|[^\s|,]+')
_VARIABLE_FIELDS = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)?((?:\.[A-Za-z_][A-Za-z0-9_]*)*)$")
_DOT_FIELDS = re.compile(r"^((?:\.[A-Za-z_][A-Za-z0-9_]*)+|\.)$")


class TemplateUnsupported(Exception):
    """The template uses a construct this interpreter does not implement."""


class TemplateError(Exception):
    """The template is valid but its evaluation failed (e.g. a missing value)."""


@dataclass
class _Text:
    text: str


@dataclass
class _Action:
    pipeline: list[str]


@dataclass
class _If:
    pipeline: list[str]
    then: list[Any] = field(default_factory=list)
    otherwise: list[Any] = field(default_factory=list)
    in_else: bool = False


@dataclass
class _Range:
    variables: list[str]
    pipeline: list[str]
    body: list[Any] = field(default_factory=list)


def _lex(source: str) -> list[tuple[str, str]]:
    """("text", s) and ("action", s) pieces, with trim markers already applied to the text."""
    pieces: list[tuple[str, str]] = []
    position = 0
    trim_next = False
    for match in _ACTION.finditer(source):
        text = source[position : match.start()]
        if trim_next:
            text = text.lstrip(" \t\r\n")
        if match.group(1):
            text = text.rstrip(" \t\r\n")
        pieces.append(("text", text))
        pieces.append(("action", match.group(2).strip()))
        trim_next = bool(match.group(3))
        position = match.end()
    tail = source[position:]
    pieces.append(("text", tail.lstrip(" \t\r\n") if trim_next else tail))
    if "{{" in "".join(text for kind, text in pieces if kind == "text"):
        raise TemplateUnsupported("an action without its closing braces, or a trim marker without a space")
    return pieces


def parse(source: str) -> list[Any]:
    root: list[Any] = []
    stack: list[tuple[Any, list[Any]]] = [(None, root)]
    for kind, text in _lex(source):
        body = stack[-1][1]
        if kind == "text":
            if text:
                body.append(_Text(text))
            continue
        if text.startswith("/*") and text.endswith("*/"):
            continue
        tokens = _TOKEN.findall(text)
        if not tokens:
            raise TemplateUnsupported("empty action")
        keyword = tokens[0]
        if keyword == "if":
            node: Any = _If(tokens[1:])
            body.append(node)
            stack.append((node, node.then))
        elif keyword == "else":
            owner = stack[-1][0]
            if not isinstance(owner, _If) or owner.in_else or len(tokens) > 1:
                raise TemplateUnsupported(f"{{{{ {text} }}}}: only a plain else inside if")
            owner.in_else = True
            stack[-1] = (owner, owner.otherwise)
        elif keyword == "range":
            node = _range_node(tokens[1:])
            body.append(node)
            stack.append((node, node.body))
        elif keyword == "end":
            if len(stack) == 1:
                raise TemplateError("{{ end }} without a block")
            stack.pop()
        elif keyword in ("with", "define", "template", "block", "include", "tpl", "break", "continue"):
            raise TemplateUnsupported(f"{{{{ {text} }}}}: `{keyword}` is not implemented")
        elif keyword.startswith("$") and len(tokens) > 1 and tokens[1] in (":=", "="):
            raise TemplateUnsupported(f"{{{{ {text} }}}}: variable assignment is not implemented")
        else:
            body.append(_Action(tokens))
    if len(stack) != 1:
        raise TemplateError("a block is not closed with {{ end }}")
    return root


def _range_node(tokens: list[str]) -> _Range:
    if ":=" not in tokens:
        return _Range([], tokens)
    split = tokens.index(":=")
    names = [t for t in tokens[:split] if t != ","]
    if not 1 <= len(names) <= 2 or not all(re.fullmatch(r"\$[A-Za-z_]\w*", n) for n in names):
        raise TemplateUnsupported(f"range declaration {' '.join(tokens[:split])}")
    return _Range(names, tokens[split + 1 :])


# --- evaluation -------------------------------------------------------------------------------------


def _lookup(value: Any, fields: str, where: str) -> Any:
    for name in [f for f in fields.split(".") if f]:
        if not isinstance(value, dict):
            raise TemplateError(f"{where}: cannot read field {name} of a {type(value).__name__}")
        if name not in value:
            raise TemplateError(f"{where}: no value at {name}")
        value = value[name]
    return value


@dataclass
class _Scope:
    dot: Any
    root: Any
    variables: dict[str, Any]


def _operand(token: str, scope: _Scope) -> Any:
    if token.startswith('"'):
        return json.loads(token)
    if re.fullmatch(r"-?\d+", token):
        return int(token)
    if token in ("true", "false"):
        return token == "true"
    dot_match = _DOT_FIELDS.match(token)
    if dot_match:
        return scope.dot if token == "." else _lookup(scope.dot, token, token)
    var_match = _VARIABLE_FIELDS.match(token)
    if var_match:
        name, fields = var_match.group(1), var_match.group(2)
        if name is None:
            base = scope.root
        elif f"${name}" in scope.variables:
            base = scope.variables[f"${name}"]
        else:
            raise TemplateError(f"undefined variable ${name}")
        return _lookup(base, fields, token)
    raise TemplateUnsupported(f"operand {token!r}")


def to_yaml(value: Any) -> str:
    """Helm's toYaml: sigs.k8s.io/yaml output (keys sorted, block style) without the final newline."""
    text: str = yaml.safe_dump(value, sort_keys=True, default_flow_style=False, width=1_000_000)
    if text.endswith("\n...\n"):
        text = text[: -len("...\n")]
    return text.rstrip("\n")


def _indent(width: int, text: Any) -> str:
    pad = " " * width
    return pad + str(text).replace("\n", "\n" + pad)


def _quote(value: Any) -> str:
    """sprig's quote: Go's %q of the value's string form (ASCII printable input: JSON's escaping agrees)."""
    text = _print(value) if value is not None else ""
    if any(ord(c) < 0x20 or ord(c) > 0x7E for c in text):
        raise TemplateUnsupported("quote of non-ASCII or control characters (Go's %q escapes differ)")
    return json.dumps(text)


_FUNCTIONS: dict[str, Any] = {
    "toYaml": (1, to_yaml),
    "nindent": (2, lambda width, text: "\n" + _indent(width, text)),
    "indent": (2, _indent),
    "quote": (1, _quote),
}


def _pipeline(tokens: list[str], scope: _Scope) -> Any:
    commands: list[list[str]] = [[]]
    for token in tokens:
        if token == "|":
            commands.append([])
        else:
            commands[-1].append(token)
    result: Any = None
    for index, command in enumerate(commands):
        if not command:
            raise TemplateError("empty command in pipeline")
        name, args = command[0], command[1:]
        if name in _FUNCTIONS:
            arity, function = _FUNCTIONS[name]
            values = [_operand(a, scope) for a in args]
            if index > 0:
                values.append(result)
            if len(values) != arity:
                raise TemplateError(f"{name} takes {arity} argument(s), got {len(values)}")
            result = function(*values)
        elif re.fullmatch(r"[A-Za-z_]\w*", name) and name not in ("true", "false"):
            raise TemplateUnsupported(f"function {name}")
        else:
            if index > 0 or args:
                raise TemplateUnsupported(f"command {' '.join(command)}")
            result = _operand(name, scope)
    return result


def _truthy(value: Any) -> bool:
    if value is None or value is False:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value != 0
    if isinstance(value, (str, list, dict)):
        return len(value) > 0
    return True


def _print(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        if abs(value) >= 1e6:
            raise TemplateUnsupported(f"printing {value}: Helm prints it in exponent form; quote it")
        if float(value).is_integer():
            return str(int(value))
        return repr(float(value))
    if value is None:
        raise TemplateError("printing a nil value")
    raise TemplateUnsupported(f"printing a {type(value).__name__}: use toYaml")


def _execute(nodes: list[Any], scope: _Scope, out: list[str]) -> None:
    for node in nodes:
        if isinstance(node, _Text):
            out.append(node.text)
        elif isinstance(node, _Action):
            out.append(_print(_pipeline(node.pipeline, scope)))
        elif isinstance(node, _If):
            branch = node.then if _truthy(_pipeline(node.pipeline, scope)) else node.otherwise
            _execute(branch, scope, out)
        elif isinstance(node, _Range):
            collection = _pipeline(node.pipeline, scope)
            if collection is None:
                continue
            if isinstance(collection, dict):
                items = [(key, collection[key]) for key in sorted(collection)]
            elif isinstance(collection, list):
                items = list(enumerate(collection))
            else:
                raise TemplateError(f"range over a {type(collection).__name__}")
            for key, item in items:
                variables = dict(scope.variables)
                if len(node.variables) == 1:
                    variables[node.variables[0]] = item
                elif len(node.variables) == 2:
                    variables[node.variables[0]] = key
                    variables[node.variables[1]] = item
                _execute(node.body, _Scope(item, scope.root, variables), out)


def render(source: str, context: dict[str, Any]) -> str:
    """Render one template with `context` as `.` and `$` (Values, Release, Chart)."""
    out: list[str] = []
    _execute(parse(source), _Scope(context, context, {}), out)
    return "".join(out)


def helm_context(
    chart_yaml: dict[str, Any], values: dict[str, Any], release: str, namespace: str
) -> dict[str, Any]:
    """The top-level objects Helm gives a template, limited to the fields the chart reads."""
    return {
        "Values": values,
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
        "Chart": {
            "Name": chart_yaml["name"],
            "Version": chart_yaml["version"],
            "AppVersion": chart_yaml.get("appVersion", ""),
        },
    }
