"""Function length in src/attnkit: no function body is longer than 60 lines (its docstring
not counted), except those listed in ``LONG_FUNCTIONS``, at most two, each with a comment
right above its definition that says why it stays long.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.test_layering import module_files

MAX_BODY_LINES = 60
MAX_EXCEPTIONS = 2

# Qualified name → why it may be longer.
LONG_FUNCTIONS = {
    "attnkit.functional.linear_triton._backward_kernel": (
        "one Triton program whose forward and backward walks share the offsets, masks and bases set up at its start"
    ),
}

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def _functions(tree: ast.AST, prefix: str) -> Iterator[tuple[str, FunctionNode]]:
    """Every function and method under ``tree``, nested ones too, by qualified name."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}.{node.name}"
            yield name, node
            yield from _functions(node, name)
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}.{node.name}")


def body_lines(node: FunctionNode) -> int:
    """The lines of a function's body from its first statement after the docstring."""
    body = node.body
    first = body[0]
    has_docstring = (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    )
    start = body[1].lineno if has_docstring and len(body) > 1 else first.lineno
    assert node.end_lineno is not None
    return node.end_lineno - start + 1


def long_functions() -> dict[str, tuple[int, Path, FunctionNode]]:
    """Qualified name → (body lines, file, node) of every function over the limit."""
    found = {}
    for module, path in module_files().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name, node in _functions(tree, module):
            lines = body_lines(node)
            if lines > MAX_BODY_LINES:
                found[name] = (lines, path, node)
    return found


def test_no_function_body_is_longer_than_60_lines() -> None:
    found = long_functions()
    unlisted = [f"{name} ({found[name][0]} lines)" for name in sorted(found) if name not in LONG_FUNCTIONS]
    assert not unlisted, (
        f"function bodies over {MAX_BODY_LINES} lines: {', '.join(unlisted)}; split them into named steps"
    )


def test_the_exceptions_are_few_long_and_say_why() -> None:
    assert len(LONG_FUNCTIONS) <= MAX_EXCEPTIONS
    found = long_functions()
    for name in LONG_FUNCTIONS:
        assert name in found, f"{name} is listed as long but is not (or no longer exists): take it off the list"
        _, path, node = found[name]
        lines = path.read_text(encoding="utf-8").splitlines()
        first_line = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        above = lines[first_line - 2].strip()
        assert above.startswith("#"), f"{name} needs a comment right above its definition saying why it is long"


def test_body_lines_skip_the_docstring_and_count_the_rest() -> None:
    source = 'def f():\n    """Doc\n    string."""\n    a = 1\n\n    return a\n'
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef)
    assert body_lines(node) == 3
