"""One home per name: a list of names (levels, colour scales, viewer colour modes, kinds of
attention, dtypes) or a pattern is written once in src/, and every module that offers or
checks it imports it from there: the torch-free :mod:`attnkit.inspect.names` for what the
inspection tools and pictures are asked for, :mod:`attnkit.models.model.names` for what a
model is asked for (below :mod:`attnkit.inspect` in the layers), and
:data:`attnkit.models.MODELS` for the models known by name."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "attnkit"

# Lists still written twice, each with the change that mends it: when it is made, the entry goes.
KNOWN_COPIES: dict[frozenset[str], str] = {}


def _module_constants() -> dict[object, set[str]]:
    """Each literal list of names (two or more strings) or compiled pattern assigned at the
    top of a module → where: ``"path:NAME"``."""
    found: dict[object, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            where = f"{path.relative_to(SRC)}:{ast.unparse(target)}"
            value = node.value
            if isinstance(value, ast.Call) and ast.unparse(value.func) == "re.compile" and value.args:
                key: object = ("pattern", ast.unparse(value.args[0]))
            else:
                try:
                    literal = ast.literal_eval(value)
                except ValueError:
                    continue
                if not isinstance(literal, (tuple, list, set, frozenset)) or len(literal) < 2:
                    continue
                if not all(isinstance(item, str) for item in literal):
                    continue
                key = ("names", tuple(sorted(literal)))
            found.setdefault(key, set()).add(where)
    return found


def test_no_list_of_names_or_pattern_is_written_twice() -> None:
    twice = [sorted(where) for where in _module_constants().values() if len(where) > 1]
    assert [where for where in twice if frozenset(where) not in KNOWN_COPIES] == []


def test_the_known_copies_are_still_there() -> None:
    """An entry of KNOWN_COPIES goes when its copy does."""
    twice = {frozenset(where) for where in _module_constants().values() if len(where) > 1}
    assert set(KNOWN_COPIES) <= twice


def test_the_command_line_offers_the_librarys_own_lists() -> None:
    from attnkit.cli import common
    from attnkit.inspect import maps, names
    from attnkit.models import MODELS, loading
    from attnkit.models.model import encoder_decoder
    from attnkit.models.model import names as model_names
    from attnkit.nn import activation_cache, hooks
    from attnkit.viz import heatmap
    from attnkit.viz.viewer import data

    assert common.LEVELS is names.LEVELS is maps.LEVELS
    assert common.SCALES is names.SCALES is heatmap.SCALES
    assert common.MODELS is MODELS
    assert common.DTYPE_NAMES is model_names.DTYPE_NAMES and tuple(loading.DTYPES) == model_names.DTYPE_NAMES
    assert names.ATTENTION_KINDS is model_names.ATTENTION_KINDS is encoder_decoder.ATTENTION_KINDS
    assert data.SECTION_NAMES["causal"] == ("self", *names.VIEWER_MODES)
    assert hooks.LAYER_INDEX is activation_cache.LAYER_INDEX


def test_patch_offers_the_patching_names() -> None:
    from attnkit.cli import patch
    from attnkit.inspect import interventions, names

    for name in ("BY", "COMPONENTS", "PER_HEAD", "METRICS"):
        assert getattr(patch, name) is getattr(names, name) is getattr(interventions, name)


def test_the_dtype_choices_are_loads_dtypes() -> None:
    import argparse

    from attnkit.cli.common import add_model_source_arguments
    from attnkit.models.loading import DTYPES

    parser = argparse.ArgumentParser()
    add_model_source_arguments(parser)
    (dtype,) = [action for action in parser._actions if action.dest == "dtype"]
    assert tuple(dtype.choices or ()) == ("auto", *DTYPES)


def test_a_set_of_layers_or_heads_is_chosen_by_one_selector() -> None:
    """Sorted distinct indices of a selection are :func:`attnkit.functional.indices.select_indices`'
    job: nothing else makes a set of :func:`~attnkit.functional.indices.normalize_indices`."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "functional" / "indices.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) in ("set", "frozenset")
                and node.args
                and isinstance(node.args[0], ast.Call)
                and ast.unparse(node.args[0].func).endswith("normalize_indices")
            ):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert found == [], "use select_indices"


def test_the_layers_of_a_model_are_chosen_by_the_model() -> None:
    """The analyses read their layers through :meth:`attnkit.models.Model.layer_indices` and the
    command line's ``--layers``/``--heads`` through ``select_indices``: no wrapper of their own."""
    from attnkit.cli import inspect_plan
    from attnkit.inspect import methods
    from attnkit.models import Model

    assert not hasattr(methods, "layer_indices") and not hasattr(Model, "_layers")
    assert inspect_plan.parse_layers("5,0,-1,5", 6) == [5, 0] and inspect_plan.parse_heads("2,all", 3) == [2, 0, 1]
