"""One word, one meaning: the renamed words stay out of src/ (see docs/glossary.md).

A names filter (which activations to keep) is ``names_filter=``; a KV cache is
``kv_cache=`` (``self_kv_cache=``, ``cross_kv_cache=``); the last layer's output is
``last_hidden_state``; a model's :class:`~attnkit.models.families.family.ModelFamily` is
``Model.model_family`` (``Model.family`` is its name); fetched checkpoints live in
``attnkit.models.checkpoints.store``; the table of families is ``attnkit.models.families.table``; an
encoder–decoder is ``encoder_decoder`` (never ``seq2seq``). The old
spellings live on only as strings in ``attnkit.deprecation`` calls, for one release.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

SRC = Path(__file__).resolve().parents[1] / "src" / "attnkit"

OLD_IDENTIFIERS = {
    "self_cache": "self_kv_cache",
    "cross_cache": "cross_kv_cache",
    "hidden_states": "last_hidden_state",
    "encoder_hidden_states": "encoder_last_hidden_state",
    "architecture": "model_family",
    "Family": "FamilyName",
}
# ``attnkit.models.families`` was the table of families until 0.1 (now
# ``attnkit.models.families.table``); the name is free again and is the package of the family
# files, the word's meaning in docs/glossary.md. Its old module paths are in
# ``attnkit.models.moved.MOVED_MODULES``.
OLD_MODULES = {
    "attnkit.models.cache": "attnkit.models.checkpoints.store",
    "attnkit.nn.seq2seq": "attnkit.nn.encoder_decoder",
    "attnkit.inspect.seq2seq": "attnkit.inspect.encoder_decoder",
    "attnkit.inspect.seq2seq_ablation": "attnkit.inspect.encoder_decoder_ablation",
}
# Callables whose activation filter is names_filter= or whose KV cache is kv_cache=.
FILTER_OR_KV_CALLS = {
    "run",
    "run_batch",
    "run_with_hooks",
    "run_with_cache",
    "hook_session",
    "cached_points",
    "run_bytes",
    "check_run_memory",
    "decode",
    "last_hidden_state",
    "forward",
    "forward_record",
}
DEPRECATION_HELPERS = {"renamed_keywords", "deprecated_aliases"}


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _identifiers(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every name the code spells (not strings), outside the deprecation helpers' calls."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node) in DEPRECATION_HELPERS:
            skip.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, ast.arg):
            yield node.lineno, node.arg
        elif isinstance(node, ast.keyword) and node.arg is not None:
            yield node.lineno, node.arg
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.lineno, node.name
        elif isinstance(node, ast.alias):
            yield node.lineno, (node.asname or node.name).rpartition(".")[2]


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_old_identifier(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [
        f"line {line}: {name} (now {OLD_IDENTIFIERS[name]})"
        for line, name in _identifiers(tree)
        if name in OLD_IDENTIFIERS
    ]
    found += [
        f"line {line}: {name} (say encoder_decoder)" for line, name in _identifiers(tree) if "seq2seq" in name.lower()
    ]
    assert not found, f"{path.relative_to(SRC)} spells renamed words: {found}"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(SRC)))
def test_cache_means_one_thing(path: Path) -> None:
    """No ``cache=``/``names=`` filter and no bare ``cache=`` KV cache, in calls or parameters."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and _call_name(node) in FILTER_OR_KV_CALLS:
            found += [
                f"line {k.lineno}: {_call_name(node)}({k.arg}=)" for k in node.keywords if k.arg in ("cache", "names")
            ]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                kind = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                if arg.arg in ("cache", "names") and (
                    "NameFilter" in kind or "KVCache" in kind or "DecoderCache" in kind
                ):
                    found.append(f"line {arg.lineno}: {node.name}({arg.arg}: {kind})")
    assert not found, f"{path.relative_to(SRC)}: use names_filter= / kv_cache=: {found}"


def test_old_modules_are_gone() -> None:
    for old, new in OLD_MODULES.items():
        assert not (SRC.parent / (old.replace(".", "/") + ".py")).exists(), f"{old} is now {new}"
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                spelled = {node.module} | {f"{node.module}.{a.name}" for a in node.names}
                assert not spelled & OLD_MODULES.keys(), (
                    f"{path.relative_to(SRC)} line {node.lineno} imports {spelled & OLD_MODULES.keys()}"
                )


def test_the_public_old_spellings_are_kept_for_one_release() -> None:
    import inspect

    from attnkit.models import Model, ModelRun
    from attnkit.nn import HookedModule

    for method in (Model.run, Model.run_batch, Model.run_with_hooks, Model.run_with_cache, HookedModule.run_with_cache):
        assert hasattr(method, "__wrapped__") and "names_filter" in inspect.signature(method).parameters, method
    for cls, old in (
        (ModelRun, "hidden_states"),
        (Model, "architecture"),
        (Model, "run_seq2seq"),
        (Model, "run_seq2seq_batch"),
    ):
        assert isinstance(inspect.getattr_static(cls, old), property), f"{cls.__name__}.{old}"


def test_the_old_spellings_still_work_with_a_warning() -> None:
    from attnkit.deprecation import deprecated_aliases, renamed_keywords

    @deprecated_aliases(old="new", removed_in="9.9")
    class Record:
        new = 3

    @renamed_keywords(cache="names_filter", removed_in="9.9")
    def run(*, names_filter: int = 0) -> int:
        return names_filter

    with pytest.warns(DeprecationWarning, match=r"Record.old is now Record.new"):
        assert Record().old == 3
    with pytest.warns(DeprecationWarning, match=r"names_filter="):
        assert run(cache=5) == 5
    with pytest.raises(TypeError, match="both cache= and names_filter="):
        run(cache=1, names_filter=2)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(SRC)))
def test_a_records_model_name_is_model_name(path: Path) -> None:
    """A result record's field holding the model's name is ``model_name``: ``model`` names a
    :class:`attnkit.models.Model` (the JSON files keep the key ``"model"``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [
        f"line {node.lineno}: {cls.name}.model: str"
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef) and any(_decorator_name(d) == "dataclass" for d in cls.decorator_list)
        for node in cls.body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.target.id == "model"
        and ast.unparse(node.annotation) == "str"
    ]
    assert not found, f"{path.relative_to(SRC)} names a model's name `model` (now model_name): {found}"


def _decorator_name(decorator: ast.expr) -> str:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")


def test_the_old_model_field_still_reads_with_a_warning() -> None:
    from attnkit.inspect.maps import AttentionMap

    amap = AttentionMap(
        model_name="toy",
        text="a b",
        tokens=["a", "b"],
        labels=["a", "b"],
        layer=0,
        num_layers=1,
        heads=[0],
        weights=torch.zeros(1, 2, 2),
    )
    with pytest.warns(DeprecationWarning, match="model_name"):
        assert amap.model == "toy"
