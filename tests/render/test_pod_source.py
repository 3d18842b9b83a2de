"""The pod's copy of each module (render/pod_source.py): the same code on the same lines, fewer bytes."""

from __future__ import annotations

import ast
import io
import tokenize
import traceback
from pathlib import Path

import pytest

from deploykit.paths import PACKAGE_DIR
from deploykit.render.pod_source import pod_source

MODULES = sorted(path for path in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in path.parts)


def _without_module_docstring(tree: ast.Module) -> ast.Module:
    if ast.get_docstring(tree, clean=False) is not None:
        tree.body = tree.body[1:]
    return tree


def _without_body_docstrings(tree: ast.Module) -> ast.Module:
    """Each class's and function's docstring taken out, where it is not the whole body."""
    for node in ast.walk(tree):
        is_body = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        if is_body and len(node.body) > 1 and ast.get_docstring(node, clean=False) is not None:
            node.body = node.body[1:]
    return tree


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE_DIR)))
def test_every_module_keeps_its_code_on_the_same_lines(path: Path) -> None:
    source = path.read_bytes()
    copy = pod_source(source)
    original = ast.parse(source)
    stripped = ast.parse(copy)
    if b"__doc__" in source:  # argparse descriptions: the module reads its own docstrings
        assert ast.get_docstring(stripped) == ast.get_docstring(original)
    else:
        assert ast.get_docstring(stripped) is None
        original = _without_module_docstring(original)
        if b"import typer" not in source:  # typer's --help is its commands' docstrings: those stay
            original = _without_body_docstrings(original)
            stripped = _without_body_docstrings(stripped)  # one left in place (it shares its line) too
    # Every node, with its line and column: a traceback from the pod names the source's lines.
    assert ast.dump(stripped, include_attributes=True) == ast.dump(original, include_attributes=True)
    assert copy.count(b"\n") == source.count(b"\n")
    assert not [
        token for token in tokenize.tokenize(io.BytesIO(copy).readline) if token.type == tokenize.COMMENT
    ]


def test_the_copy_is_what_the_pod_runs_and_smaller() -> None:
    total = sum(len(path.read_bytes()) for path in MODULES)
    copied = sum(len(pod_source(path.read_bytes())) for path in MODULES)
    assert copied < 0.92 * total, (copied, total)


def test_a_comment_or_a_docstring_edit_gives_the_same_bytes_and_a_code_edit_does_not() -> None:
    before = b'"""Why this module."""\n\nimport os  # the environment\n\nVALUE = 1\n'
    reworded = b'"""Why this module, said better."""\n\nimport os  # where vLLM reads it\n\nVALUE = 1\n'
    recoded = b'"""Why this module."""\n\nimport os  # the environment\n\nVALUE = 2\n'
    assert pod_source(before) == pod_source(reworded)
    assert pod_source(before) != pod_source(recoded)


def test_a_traceback_from_the_copy_names_the_sources_line() -> None:
    source = (
        b'"""A module\nwhose docstring\nspans three lines."""\n\n# why\n'
        b'def fail():  # here\n    raise ValueError("x")\n'
    )
    namespace: dict[str, object] = {}
    exec(compile(pod_source(source), "copy.py", "exec"), namespace)
    with pytest.raises(ValueError) as raised:
        namespace["fail"]()  # type: ignore[operator]
    assert traceback.extract_tb(raised.tb)[-1].lineno == 7


def test_strings_that_hold_a_hash_and_a_docstring_sharing_its_line_with_code_are_kept() -> None:
    source = b'"""Doc."""; VALUE = "# not a comment"  # a comment\nURL = "http://x/#frag"\n'
    copy = pod_source(source)
    assert copy == b'"""Doc."""; VALUE = "# not a comment"\nURL = "http://x/#frag"\n'


def _tokenizer_reference(source: bytes) -> bytes:
    """What Python's own tokenizer calls comments and the module docstring, blanked the same way: the
    reference `pod_source`'s single regular expression is held to."""
    text = source.decode("utf-8")
    lines = text.splitlines(keepends=True)
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    for token in tokens:
        if token.type == tokenize.COMMENT:
            row, column = token.start
            line = lines[row - 1]
            lines[row - 1] = line[:column].rstrip() + line[len(line.rstrip("\r\n")) :]
    code = [t for t in tokens if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING)]
    is_docstring = (
        "__doc__" not in text
        and len(code) > 1
        and code[0].type == tokenize.STRING
        and code[0].start[1] == 0
        and code[1].type == tokenize.NEWLINE
        and code[0].string.lstrip("rRuU")[:1] in ("'", '"')
    )
    blank = [(code[0].start[0], code[0].end[0])] if is_docstring else []
    if "__doc__" not in text and "import typer" not in text:
        blank += _body_docstrings(tokens)
    for first, last in blank:
        for row in range(first, last + 1):
            line = lines[row - 1]
            lines[row - 1] = line[len(line.rstrip("\r\n")) :]
    return "".join(lines).encode("utf-8")


def _body_docstrings(tokens: list[tokenize.TokenInfo]) -> list[tuple[int, int]]:
    """By the tokens alone: a string that is a whole logical line right after a `def`/`class` header's INDENT,
    when more code follows it in that block (a DEDENT right after it would leave the body empty)."""
    found = []
    code = [t for t in tokens if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING)]
    for index in range(2, len(code) - 2):
        string, after, next_ = code[index], code[index + 1], code[index + 2]
        if string.type != tokenize.STRING or code[index - 1].type != tokenize.INDENT:
            continue
        if after.type != tokenize.NEWLINE or next_.type == tokenize.DEDENT:
            continue
        if string.string.lstrip("rRuU")[:1] not in ("'", '"'):
            continue
        start = index - 2  # the header's NEWLINE; its first token follows the NEWLINE before it
        while start > 0 and code[start - 1].type != tokenize.NEWLINE:
            start -= 1
        opener = [t.string for t in code[start:index] if t.type not in (tokenize.INDENT, tokenize.DEDENT)]
        if opener[:1] == ["async"]:
            opener = opener[1:]
        if opener[:1] in (["def"], ["class"]):
            found.append((string.start[0], string.end[0]))
    return found


HARD_CASES = {
    "hash-in-every-quote": b"A = '#'\nB = \"#\"\nC = '''#\n#'''\nD = \"\"\"# \"\"\"  # c\n",
    "escaped-quotes": b'A = \'it\\\'s # no\'  # yes\nB = "say \\"#\\""  # yes\n',
    "raw-backslash-quote": b"A = r'\\'#'  # c\nB = rb\"\\\\\"  # c\n",
    "f-string-nested": b"A = f\"{'#'} {x['#']!r:>{w}}\"  # c\nB = f'''{\"#\"}'''\n",
    "implicit-concatenation": b"A = ('#'  # one\n     \"#\"  # two\n)\n",
    "continuation": b"A = 1 + \\\n    2  # c\n",
    "docstring-then-comment": b'"""Doc."""  # c\nA = 1\n',
    "docstring-after-comments": b"# a\n\n# b\n'''Doc\n# not a comment\n'''\nA = 1\n",
    "bytes-first": b'b"""Not a docstring."""\nA = 1\n',
    "f-string-first": b'f"""Not a docstring."""\nA = 1\n',
    "raw-docstring": b'r"""Doc \\d."""\nA = 1\n',
    "string-then-code": b'"""Doc.""" + X\n',
    "indented-first": b'if True:\n    """Not the module\'s."""\n',
    "code-first": b'A = 1\n"""Not a docstring."""\n',
    "reads-its-doc": b'"""Usage."""\nprint(__doc__)  # c\n',
    "crlf": b'"""Doc."""\r\nA = "#"  # c\r\n',
    "unicode": "A = 'é#ü'  # ç\nB = 'ü'\n".encode(),
    "empty": b"",
    "function-docstring": b'def f():\n    """Why."""\n    return 1\n',
    "class-docstring-only": b'class A:\n    """The whole body."""\n',
    "method-docstring-shares-a-line": b'class A:\n    def f(self):\n        """Why."""; return 1\n',
    "async-and-nested": (
        b'async def f():\n    """Why."""\n    def g():\n        """And."""\n        return 2\n    return g\n'
    ),
    "not-after-a-header": b'if X:\n    """A string, not a docstring."""\n    Y = 1\n',
    "typer-module-keeps-them": b'import typer\n\ndef cmd():\n    """Its --help."""\n    return 1\n',
}


@pytest.mark.parametrize("source", HARD_CASES.values(), ids=HARD_CASES.keys())
def test_the_hard_cases_match_pythons_tokenizer(source: bytes) -> None:
    assert pod_source(source) == _tokenizer_reference(source)
    compile(pod_source(source), "copy.py", "exec")


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE_DIR)))
def test_every_module_matches_pythons_tokenizer(path: Path) -> None:
    source = path.read_bytes()
    assert pod_source(source) == _tokenizer_reference(source)
