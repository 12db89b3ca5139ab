"""The package's structure: no import cycle between attnkit's modules, and no import from a
lower layer to a higher one (functional → nn → models → inspect → viz → train →
distributed, serve → cli; each imports only the ones before it). Inside ``attnkit.models``
the same holds for its wings: how a checkpoint arrives (``checkpoints``) → the family files
(``families``) → the ``Model`` users hold (``model``) → ``load()`` and the package itself.

Every import counts: at the top of a module, inside a function, under ``TYPE_CHECKING``, and
``importlib.import_module("attnkit....")`` with a literal name. The one exception is
``from attnkit import __version__``, a constant that any layer may show.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Rank of each top-level part of attnkit: a module may import modules of its own rank or lower.
LAYERS = {
    "functional": 0,
    "masks": 0,  # attnkit.masks re-exports attnkit.functional.masks
    "deprecation": 0,  # old spellings kept for one release
    "_lazy": 0,  # attnkit._lazy: every package's import on first use; imports nothing of attnkit
    "nn": 1,
    "models": 2,
    "inspect": 3,
    "viz": 4,
    "train": 5,
    "distributed": 6,
    "serve": 6,
    "cli": 7,
    "__main__": 8,
    "": 8,  # the package itself: the facade over the layers
}

# Rank of each wing of attnkit.models ("" is a module directly in the package: load(), the
# package itself, what inspect reads of a model, the old paths).
MODEL_WINGS = {"checkpoints": 0, "families": 1, "model": 2, "": 3}
# Imports that still run from a lower wing to a higher one, each with the change that mends
# it: when it is made, the entry goes.
UPWARD_IN_MODELS: dict[tuple[str, str], str] = {}


def module_files() -> dict[str, Path]:
    """Module name → file, for every module under src/attnkit."""
    files = {}
    for path in sorted((SRC / "attnkit").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path
    return files


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The attnkit modules that ``name`` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            if base == "attnkit" and [alias.name for alias in node.names] == ["__version__"]:
                continue
            # ``from package import submodule`` imports the submodule.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            targets = [node.args[0].value]
        found.update(t for t in targets if t in known and t != name)
    return found


def import_graph() -> dict[str, set[str]]:
    known = module_files()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def layer(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_part_of_attnkit_has_a_layer():
    assert {layer(m) for m in module_files()} <= set(LAYERS)


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_no_import_from_a_lower_layer_to_a_higher_one():
    upward = sorted(
        f"{source} imports {target}"
        for source, targets in import_graph().items()
        for target in targets
        if LAYERS[layer(target)] > LAYERS[layer(source)]
    )
    assert upward == []


def model_wing(module: str) -> str | None:
    """The wing of attnkit.models a module belongs to, or ``None`` outside the package."""
    parts = module.split(".")
    if parts[:2] != ["attnkit", "models"]:
        return None
    return parts[2] if len(parts) > 3 else ""


def upward_imports_in_models() -> set[tuple[str, str]]:
    return {
        (source, target)
        for source, targets in import_graph().items()
        for target in targets
        if (wing := model_wing(source)) is not None
        and (target_wing := model_wing(target)) is not None
        and MODEL_WINGS[target_wing] > MODEL_WINGS[wing]
    }


def test_every_module_of_attnkit_models_is_in_a_wing():
    assert {model_wing(m) for m in module_files()} - {None} <= set(MODEL_WINGS)


def test_no_import_from_a_lower_wing_of_attnkit_models_to_a_higher_one():
    found = upward_imports_in_models()
    unlisted = sorted(f"{source} imports {target}" for source, target in found - UPWARD_IN_MODELS.keys())
    assert unlisted == []
    mended = sorted(f"{source} → {target}" for source, target in UPWARD_IN_MODELS.keys() - found)
    assert mended == [], "no longer imported: take these off UPWARD_IN_MODELS"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from attnkit.viz.viewer import render_html\n", {"attnkit.viz.viewer"}),
        ("def f():\n    from attnkit.inspect import maps\n", {"attnkit.inspect.maps"}),
        ("import importlib\nimportlib.import_module('attnkit.nn.attention')\n", {"attnkit.nn.attention"}),
        ("from attnkit import __version__\n", set()),
    ],
)
def test_the_walker_sees_every_kind_of_import(tmp_path, source, expected):
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert imports_of("attnkit.functional.probe", path, module_files()) == expected


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
