"""`attnkit.inspect.capture` against Hugging Face's own eager `output_attentions=True`, on tiny
randomly initialised models built from configs (no download)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnkit.inspect import CapturedAttention, capture  # noqa: E402


def tiny_llama():
    """LLaMA with grouped-query attention: 6 query heads share 2 key/value heads."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return transformers.LlamaForCausalLM(config).eval()


def tiny_bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=32,
    )
    return transformers.BertModel(config).eval()


def eager_attentions(model, **inputs):
    """The reference: the same model switched to eager attention, output_attentions=True."""
    original = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return model(**inputs, output_attentions=True)
    finally:
        model.set_attn_implementation(original)


def inputs(batch: int, length: int, pad_side: str | None = None, pad: int = 0):
    ids = torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(batch, length, dtype=torch.long)
    if pad_side == "left":
        mask[-1, :pad] = 0
    elif pad_side == "right":
        mask[-1, length - pad :] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_llama_gqa_matches_eager_and_restores_sdpa():
    model = tiny_llama()
    assert model.config._attn_implementation == "sdpa"
    x = inputs(2, 9)
    got = capture(model, **x)
    ref = eager_attentions(model, **x)
    assert isinstance(got, CapturedAttention)
    assert len(got.layers) == 3 and got.layers[0].shape == (2, 6, 9, 9)
    assert got.modules == [f"model.layers.{i}.self_attn" for i in range(3)]
    for ours, theirs in zip(got.layers, ref.attentions):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.outputs.logits, ref.logits, atol=1e-5, rtol=0)
    assert got.stack().shape == (3, 2, 6, 9, 9)
    assert model.config._attn_implementation == "sdpa"
    assert all(layer.self_attn.config._attn_implementation == "sdpa" for layer in model.model.layers)


def test_llama_left_padding_matches_eager_on_real_tokens_and_gives_zero_rows():
    model = tiny_llama()
    x = inputs(2, 9, "left", pad=4)
    got = capture(model, **x)
    ref = eager_attentions(model, **x)
    real = x["attention_mask"][-1].bool()
    for ours, theirs in zip(got.layers, ref.attentions):
        torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=0)
        # Real queries of the padded row: same weights, none on padding keys.
        torch.testing.assert_close(ours[1][:, real], theirs[1][:, real], atol=1e-5, rtol=0)
        assert ours[1][:, real][..., ~real].abs().max() == 0
        # Padding queries may attend to nothing: zeros (eager spreads them uniformly instead).
        assert torch.isfinite(ours).all() and ours[1][:, ~real].abs().max() == 0
    logits = got.outputs.logits
    torch.testing.assert_close(logits[1, real], ref.logits[1, real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("pad", [0, 3])
def test_bert_matches_eager_with_and_without_right_padding(pad):
    model = tiny_bert()
    x = inputs(2, 8, "right", pad=pad)
    got = capture(model, **x)
    ref = eager_attentions(model, **x)
    assert got.modules == ["encoder.layer.0.attention.self", "encoder.layer.1.attention.self"]
    for ours, theirs in zip(got.layers, ref.attentions):
        assert ours.shape == (2, 4, 8, 8)
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    # Bidirectional: weights above the diagonal; none on padding keys.
    assert got.layers[0][0].triu(1).sum() > 0
    if pad:
        assert got.layers[0][1][..., -pad:].abs().max() == 0
    torch.testing.assert_close(got.outputs.last_hidden_state, ref.last_hidden_state, atol=1e-5, rtol=0)
    assert model.config._attn_implementation == "sdpa"


def test_implementation_is_restored_when_the_forward_raises():
    model = tiny_llama()
    with pytest.raises((IndexError, RuntimeError)):
        capture(model, input_ids=torch.tensor([[1000]]))  # outside the vocabulary
    assert model.config._attn_implementation == "sdpa"
    got = capture(model, input_ids=torch.tensor([[1, 2, 3]]))
    assert len(got.layers) == 3


def test_a_model_loaded_in_eager_mode_stays_eager():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=48,
        attn_implementation="eager",
    )
    model = transformers.BertModel(config).eval()
    capture(model, input_ids=torch.tensor([[1, 2, 3]]))
    assert model.config._attn_implementation == "eager"


def test_rejects_what_is_not_a_transformers_model():
    with pytest.raises(TypeError, match="PreTrainedModel"):
        capture(torch.nn.Linear(2, 2), input=torch.ones(2))
