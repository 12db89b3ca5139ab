"""One word, one meaning: the renamed words stay out of src/, tests/, benchmarks/ and docs/
(see docs/glossary.md).

A names filter (which activations to keep) is ``names_filter=``; a KV cache is
``kv_cache=`` (``self_kv_cache=``, ``cross_kv_cache=``); the last layer's output is
``last_hidden_state``; a model's :class:`~attnkit.models.families.family.ModelFamily` is
``Model.model_family`` (``Model.family`` is its name); fetched checkpoints live in
``attnkit.models.checkpoints.store``; the table of families is ``attnkit.models.families.table``; an
encoder–decoder is ``encoder_decoder`` (never ``seq2seq``); a model's name is ``model_name``
(``model`` is a :class:`attnkit.models.Model`); a method that makes a KV cache is
``new_kv_cache``. The old spellings live on only as strings in ``attnkit.deprecation`` calls,
for one release, and in the tests that check they still work (inside
``pytest.warns(DeprecationWarning)``, or ``pytest.raises`` beside the new spelling); other libraries' names keep their spelling
(``transformers.AutoModelForSeq2SeqLM``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "attnkit"
# Where the vocabulary holds besides src/: the tests, the benchmarks, and the documentation's
# pages, their Python code blocks and its scripts.
ELSEWHERE = [ROOT / "tests", ROOT / "benchmarks", ROOT / "docs"]
PAGES = sorted((ROOT / "docs").rglob("*.md"))
# Names of other libraries that spell an old word.
OTHER_LIBRARIES = {"AutoModelForSeq2SeqLM"}
# The glossary names the old word once, to say it is not used.
GLOSSARY_MENTION = "never *seq2seq*"

OLD_IDENTIFIERS = {
    "self_cache": "self_kv_cache",
    "cross_cache": "cross_kv_cache",
    "hidden_states": "last_hidden_state",
    "encoder_hidden_states": "encoder_last_hidden_state",
    "architecture": "model_family",
    "Family": "FamilyName",
    "new_cache": "new_kv_cache",
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
# pytest's context managers around a use of an old spelling that must warn (or be refused).
OLD_SPELLING_CHECKS = {"warns", "deprecated_call", "raises"}


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _python_elsewhere() -> list[Path]:
    return sorted(path for folder in ELSEWHERE for path in folder.rglob("*.py"))


def _code_blocks(page: Path) -> list[tuple[int, str]]:
    """The ``python`` code blocks of a Markdown page, with the line each starts on."""
    text = page.read_text(encoding="utf-8")
    return [
        (text[: m.start()].count("\n") + 1, m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)
    ]


def _python_texts() -> list[tuple[str, str]]:
    """``(where, source)`` of every Python file of src/, tests/, benchmarks/ and docs/, and of
    every Python code block of docs/."""
    files = [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in _sources() + _python_elsewhere()]
    blocks = [(f"{page.relative_to(ROOT)}:{line}", code) for page in PAGES for line, code in _code_blocks(page)]
    return files + blocks


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _allowed_old_spellings(tree: ast.AST) -> set[int]:
    """The nodes that may spell an old word: inside the deprecation helpers' calls, and in the
    body of a ``with pytest.warns(...)`` / ``pytest.deprecated_call()`` / ``pytest.raises(...)``
    (a test that the old spelling warns, or is refused beside the new one)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node) in DEPRECATION_HELPERS:
            skip.update(id(n) for n in ast.walk(node))
        elif isinstance(node, ast.With) and any(
            isinstance(item.context_expr, ast.Call) and _call_name(item.context_expr) in OLD_SPELLING_CHECKS
            for item in node.items
        ):
            skip.update(id(n) for statement in node.body for n in ast.walk(statement))
    return skip


def _identifiers(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every name the code spells (not strings), outside the deprecation helpers' calls and
    the checks that an old spelling warns."""
    skip = _allowed_old_spellings(tree)
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


PYTHON_TEXTS = _python_texts()


@pytest.mark.parametrize(("where", "source"), PYTHON_TEXTS, ids=[where for where, _ in PYTHON_TEXTS])
def test_no_old_identifier(where: str, source: str) -> None:
    identifiers = [(line, name) for line, name in _identifiers(ast.parse(source)) if name not in OTHER_LIBRARIES]
    found = [
        f"line {line}: {name} (now {OLD_IDENTIFIERS[name]})" for line, name in identifiers if name in OLD_IDENTIFIERS
    ]
    found += [f"line {line}: {name} (say encoder_decoder)" for line, name in identifiers if "seq2seq" in name.lower()]
    assert not found, f"{where} spells renamed words: {found}"


@pytest.mark.parametrize(("where", "source"), PYTHON_TEXTS, ids=[where for where, _ in PYTHON_TEXTS])
def test_cache_means_one_thing(where: str, source: str) -> None:
    """No ``cache=``/``names=`` filter and no bare ``cache=`` KV cache, in calls or parameters."""
    found = []
    tree = ast.parse(source)
    allowed = _allowed_old_spellings(tree)
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
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
    assert not found, f"{where}: use names_filter= / kv_cache=: {found}"


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


@pytest.mark.parametrize(("where", "source"), PYTHON_TEXTS, ids=[where for where, _ in PYTHON_TEXTS])
def test_a_parameter_holding_a_models_name_is_model_name(where: str, source: str) -> None:
    """``model`` is a :class:`attnkit.models.Model`; a parameter holding its name is
    ``model_name``."""
    found = [
        f"line {arg.lineno}: {node.name}(model: {ast.unparse(arg.annotation)})"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        if arg.arg == "model" and arg.annotation is not None and "str" in ast.unparse(arg.annotation).split(" | ")
    ]
    assert not found, f"{where} names a model's name `model` (now model_name): {found}"


def test_no_file_is_named_with_an_old_word() -> None:
    found = [
        str(path.relative_to(ROOT))
        for folder in [SRC, *ELSEWHERE]
        for path in folder.rglob("*")
        if "seq2seq" in path.name.lower() and "__pycache__" not in path.parts
    ]
    assert not found, f"files named seq2seq (say encoder_decoder): {found}"


def test_the_documentation_says_encoder_decoder() -> None:
    found = [
        f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
        for page in PAGES
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if "seq2seq" in re.sub("|".join(OTHER_LIBRARIES), "", line.replace(GLOSSARY_MENTION, "")).lower()
    ]
    assert not found, f"pages that say seq2seq (say encoder–decoder): {found}"


def test_one_class_per_name() -> None:
    """Two classes of one name (``ModelInfo`` was a fetched checkpoint and a served model) read
    as one thing; each class name in src/ names one class."""
    defined: dict[str, list[str]] = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, []).append(str(path.relative_to(SRC)))
    assert not {name: where for name, where in defined.items() if len(where) > 1}


def test_levels_are_the_attention_units() -> None:
    """``LEVELS`` is ``("token", "word")``, the units a map is read in (``--level``); the
    viewer's quantisation steps are ``QUANTISED_MAX``."""
    from attnkit.inspect.names import LEVELS
    from attnkit.viz.viewer import data, long_view

    assert LEVELS == ("token", "word")
    assert not hasattr(data, "LEVELS") and not hasattr(long_view, "LEVELS")
    assert data.QUANTISED_MAX == 65535 and long_view.QUANTISED_MAX is data.QUANTISED_MAX


def test_the_old_model_keyword_and_new_cache_still_work_with_a_warning() -> None:
    from attnkit.nn import DecoderLM, DecoderLMConfig
    from attnkit.viz.estimates import estimate_long_html
    from attnkit.viz.viewer import ViewerData, viewer_data_from_lm_output

    maps = {0: torch.full((1, 2, 2), 0.5)}
    with pytest.warns(DeprecationWarning, match=r"model_name="):
        assert ViewerData.from_run(model="toy", tokens=["a", "b"], attentions=maps, causal=False).model_name == "toy"
    with pytest.warns(DeprecationWarning, match=r"model_name="):
        estimate_long_html(["a"], 1, top_k=1, block=1, model="toy")
    assert hasattr(viewer_data_from_lm_output, "__wrapped__")  # the same alias

    lm = DecoderLM(DecoderLMConfig(8, 2, 16, vocab_size=8, num_layers=1)).eval()
    with pytest.warns(DeprecationWarning, match=r"DecoderLM.new_cache is now DecoderLM.new_kv_cache"):
        kv_cache = lm.new_cache()
    assert type(kv_cache) is type(lm.new_kv_cache())
