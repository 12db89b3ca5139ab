"""What kind a model is, said in one place (attnkit.models.model.kinds): the kind of any
model with the protocol's ``causal`` and ``encoder_decoder``, one refusal that says what was
expected and what was got, one dispatch per job, and no other module of the command line,
the inspection tools, the web app or the viewer reading ``encoder_decoder`` to decide."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from attnkit.models import MODEL_KINDS, ModelKindError, model_kind
from attnkit.models.model.kinds import GENERATES, NEXT_TOKEN, ONE_TEXT, SOURCE_AND_TARGET, for_kind, require_kind
from tests.fixtures.fake_models import FakeModel

SRC = Path(__file__).resolve().parents[3] / "src" / "attnkit"
# The layers built on models, which ask the kinds module instead of the model's attributes.
EDGES = ("cli", "inspect", "serve", "viz")


@dataclass(frozen=True)
class _Described:
    """A model of the user's own, as far as its kind goes: the protocol's attributes only."""

    name: str
    family: str
    causal: bool
    encoder_decoder: bool


T5 = _Described("t5", "t5", causal=False, encoder_decoder=True)
MINILM = _Described("minilm", "bert", causal=False, encoder_decoder=False)
SMOLLM2 = _Described("smollm2", "llama", causal=True, encoder_decoder=False)


def test_a_models_kind_comes_from_the_protocols_attributes():
    assert [model_kind(m) for m in (MINILM, SMOLLM2, T5)] == list(MODEL_KINDS)
    assert model_kind(FakeModel()) == "causal"
    # An encoder-decoder is one whatever its `causal` says.
    assert model_kind(_Described("odd", "t5", causal=True, encoder_decoder=True)) == "encoder-decoder"


def test_the_kinds_the_web_app_and_the_viewer_name_are_these():
    from attnkit.serve.bodies import ServedModelBody
    from attnkit.viz.viewer import KINDS

    assert KINDS is MODEL_KINDS == ("bidirectional", "causal", "encoder-decoder")
    described = ServedModelBody.model_fields["kind"].description
    assert described is not None and all(f'"{kind}"' in described for kind in MODEL_KINDS)


def test_what_each_kind_can_do():
    assert ONE_TEXT == {"causal", "bidirectional"} and SOURCE_AND_TARGET == {"encoder-decoder"}
    assert NEXT_TOKEN == {"causal"} and GENERATES == {"causal", "encoder-decoder"}
    assert ONE_TEXT | SOURCE_AND_TARGET == set(MODEL_KINDS) and not ONE_TEXT & SOURCE_AND_TARGET


def test_require_kind_says_what_was_expected_and_what_was_got():
    assert require_kind(SMOLLM2, NEXT_TOKEN, what="patching measures next-token logits") == "causal"
    with pytest.raises(ModelKindError) as refused:
        require_kind(T5, NEXT_TOKEN, what="attribution patching measures next-token logits")
    assert str(refused.value) == (
        "t5 is an encoder-decoder (t5); attribution patching measures next-token logits (expected a causal decoder)"
    )
    assert isinstance(refused.value, ValueError)  # callers that catch ValueError still do
    with pytest.raises(ModelKindError, match=r"^minilm is a bidirectional encoder \(bert\); it cannot generate text "):
        require_kind(MINILM, GENERATES, what="it cannot generate text")
    with pytest.raises(ModelKindError, match=r"\(expected a bidirectional encoder or a causal decoder\)$"):
        require_kind(T5, ONE_TEXT, what="--detect reads one stack's self-attention")


def test_for_kind_picks_the_handler_of_the_models_kind():
    handlers = {ONE_TEXT: "maps", SOURCE_AND_TARGET: "source and target"}
    assert [for_kind(m, handlers, what="inspect") for m in (MINILM, SMOLLM2, T5)] == [
        "maps",
        "maps",
        "source and target",
    ]
    with pytest.raises(
        ModelKindError, match=r"^t5 is an encoder-decoder \(t5\); probing \(expected a causal decoder\)$"
    ):
        for_kind(T5, {NEXT_TOKEN: "probe"}, what="probing")


def test_the_jobs_refuse_a_kind_they_cannot_take_through_require_kind():
    """The inspection tools refuse by the kinds module's message, before any work."""
    from attnkit.inspect.encoder_decoder_ablation import encoder_decoder_head_ablation

    with pytest.raises(ModelKindError, match=r"fake is a causal decoder \(llama\); .*\(expected an encoder-decoder\)"):
        encoder_decoder_head_ablation(FakeModel(), "a source", "a target")  # type: ignore[arg-type]


def _reads_of_encoder_decoder(path: Path) -> list[int]:
    """The lines where ``path`` reads an ``encoder_decoder`` attribute (a call of a method
    of that name, such as ``ViewerData.encoder_decoder(...)``, is not a read)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "encoder_decoder" and id(node) not in called
    ]


def test_no_edge_module_decides_by_reading_encoder_decoder():
    """The command line, the inspection tools, the web app and the viewer ask
    ``model_kind``, ``require_kind`` or ``for_kind``; none branches on the attribute."""
    reads = [
        f"{path.relative_to(SRC)}:{line}"
        for edge in EDGES
        for path in sorted((SRC / edge).rglob("*.py"))
        for line in _reads_of_encoder_decoder(path)
    ]
    assert reads == []
