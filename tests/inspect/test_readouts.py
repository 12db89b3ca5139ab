"""What a model of one text is measured by, said once per kind (attnkit.inspect.readouts):
the readout each kind gets, what each reads and compares and refuses, and no analysis of
attnkit.inspect.interventions or attnkit.inspect.methods deciding by reading ``causal``."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from attnkit.inspect import interventions
from attnkit.inspect.metrics import of_logits
from attnkit.inspect.readouts import CAUSAL_READOUT, ENCODER_READOUT, readout
from attnkit.models import ModelKindError

INSPECT = Path(__file__).resolve().parents[2] / "src" / "attnkit" / "inspect"


@dataclass(frozen=True)
class _Described:
    """A model as far as its kind goes: the attributes of the models' protocol that say it."""

    name: str
    family: str
    causal: bool
    encoder_decoder: bool


SMOLLM2 = _Described("smollm2", "llama", causal=True, encoder_decoder=False)
MINILM = _Described("minilm", "bert", causal=False, encoder_decoder=False)
T5 = _Described("t5", "t5", causal=False, encoder_decoder=True)


def test_each_kind_of_one_text_gets_its_readout():
    assert readout(SMOLLM2) is CAUSAL_READOUT and CAUSAL_READOUT.kind == "causal"
    assert readout(MINILM) is ENCODER_READOUT and ENCODER_READOUT.kind == "bidirectional"
    with pytest.raises(ModelKindError, match=r"^t5 is an encoder-decoder \(t5\); .*\(expected a bidirectional encoder"):
        readout(T5)


def test_a_causal_readout_reads_the_next_token_logits_at_the_last_position():
    logits = torch.randn(3, 5, 7, dtype=torch.float64)  # [b, s, v]
    assert torch.equal(CAUSAL_READOUT.output(logits), logits[:, -1].float())
    words, measure = CAUSAL_READOUT.ablation_measure(" Paris", 4)
    assert words == "change in log p(' Paris') at the last position"
    assert torch.equal(measure(logits[:, -1]), torch.log_softmax(logits[:, -1], dim=-1)[:, 4])
    effects, baseline = CAUSAL_READOUT.ablation_effects(torch.tensor(-2.0), torch.tensor([-2.5, -1.0]))
    assert effects.tolist() == [-0.5, 1.0] and baseline == -2.0  # the change from the unablated run


def test_an_encoder_readout_reads_the_sentence_embedding():
    hidden = torch.randn(3, 5, 4, dtype=torch.float64)  # [b, s, e]
    assert torch.equal(ENCODER_READOUT.output(hidden), hidden.float())
    words, measure = ENCODER_READOUT.ablation_measure(None, None)
    assert words == "change in the cosine of the sentence embedding to the unablated one (cos - 1)"
    embeddings = hidden.float().mean(1)  # [b, e]
    expected = torch.nn.functional.cosine_similarity(embeddings, embeddings[:1], dim=-1) - 1.0
    assert torch.equal(measure(hidden.float()), expected)
    measured = torch.tensor([0.0, -0.25])
    effects, baseline = ENCODER_READOUT.ablation_effects(torch.tensor(0.5), measured)
    assert effects is measured and baseline == 0.0  # cos - 1 is already a change
    assert ENCODER_READOUT.ablation_target(MINILM, None) is None  # type: ignore[arg-type]


def test_the_metrics_each_readout_takes_and_refuses():
    assert interventions.check_metric(SMOLLM2, None, " a", " b") == "logit-diff"  # type: ignore[arg-type]
    assert interventions.check_metric(MINILM, None, None, None) == "cosine"  # type: ignore[arg-type]
    refusals = [
        (SMOLLM2, "cosine", None, "smollm2 is causal: its metrics are 'logit-diff', 'log-p' or a function"),
        (MINILM, "log-p", None, "minilm is a bidirectional encoder without next-token logits; its metric is 'cosine'"),
        (MINILM, "cosine", " a", "minilm is a bidirectional encoder .* takes no target token"),
        (MINILM, of_logits(lambda logits: logits[:, -1, 0], "first"), None, "minilm .*; a Metric reads logits"),
    ]
    for model, metric, target, message in refusals:
        with pytest.raises(ValueError, match=message):
            interventions.check_metric(model, metric, target, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^smollm2 is causal: give the target token whose log-probability"):
        CAUSAL_READOUT.ablation_target(SMOLLM2, None)  # type: ignore[arg-type]


def _reads_of_causal(path: Path) -> list[int]:
    """The lines where ``path`` reads a ``causal`` attribute (``model.causal``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "causal"]


@pytest.mark.parametrize("module", ["interventions.py", "methods.py"])
def test_the_analyses_ask_the_readout_instead_of_reading_causal(module):
    assert _reads_of_causal(INSPECT / module) == []
