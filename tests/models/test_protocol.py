"""The model contract lives in src: attnkit.models.Model and the test stand-ins implement
attnkit.models.InspectableModel (mypy checks Model's methods against it; here, the
stand-ins' attributes and the parameters of their methods)."""

from __future__ import annotations

import inspect

import pytest

from attnkit.models import InspectableModel, Model
from tests.fixtures.fake_models import FakeModel
from tests.fixtures.known_attention import FakeModel as KnownAttentionModel
from tests.fixtures.tiny_decoder import TinyModel

METHODS = ("tokenize", "run", "run_batch")


def _parameters(function) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values() if p.name != "self"]


@pytest.mark.parametrize("implementation", [Model, KnownAttentionModel, TinyModel], ids=lambda c: c.__name__)
def test_models_and_stand_ins_take_the_protocols_parameters(implementation):
    for method in METHODS:
        wanted = _parameters(getattr(InspectableModel, method))
        given = _parameters(getattr(implementation, method))
        assert given[: len(wanted)] == wanted, method
        assert all(
            inspect.signature(getattr(implementation, method)).parameters[name].default is not inspect.Parameter.empty
            for name, _ in given[len(wanted) :]
        ), f"{method}: parameters beyond the protocol's need defaults"


@pytest.mark.parametrize("stand_in", [KnownAttentionModel, TinyModel], ids=lambda c: c.__name__)
def test_the_stand_ins_are_inspectable_models(stand_in):
    assert issubclass(stand_in, FakeModel)
    assert isinstance(stand_in(), InspectableModel)


def test_whether_a_model_is_an_encoder_decoder_is_the_protocols_to_say():
    """attnkit reads ``model.encoder_decoder`` (a property of the protocol, which Model and the
    stand-ins have; the rest of attnkit asks attnkit.models.model_kind, which reads it),
    never a guess from an attribute that may be missing."""
    import ast
    from pathlib import Path

    assert isinstance(InspectableModel.encoder_decoder, property)
    assert FakeModel.encoder_decoder is False
    src = Path(__file__).resolve().parents[2] / "src" / "attnkit"
    guessed = [
        f"{path.relative_to(src)}:{node.lineno}"
        for path in sorted(src.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and ast.unparse(node.func) in ("getattr", "hasattr")
        and len(node.args) > 1
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value == "encoder_decoder"
    ]
    assert guessed == []
