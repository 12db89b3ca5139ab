"""The one interface of the networks that attnkit.models.Model runs
(attnkit.nn.text_module.TextModule): DecoderLM, EncoderDecoderLM and BERT's encoder each
give their hidden states with padding and chosen layers' weights, their logits and each
layer's self-attention, and ModelFamily keeps no function that forwards to them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnkit.models.families.bert import BertConfig, BertModel
from attnkit.models.families.family import ModelFamily
from attnkit.nn import DecoderLM, DecoderLMConfig, MultiHeadAttention, StackOutput
from attnkit.nn.text_module import TextModule
from tests.nn.test_encoder_decoder import tiny as tiny_encoder_decoder

V, E, H = 23, 16, 2


def _decoder() -> DecoderLM:
    torch.manual_seed(0)
    config = DecoderLMConfig(E, H, 32, vocab_size=V, num_layers=2, positional="rotary", norm="rms", bias=False)
    return DecoderLM(config).eval()


def _bert() -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=V,
        hidden_size=E,
        num_layers=2,
        num_heads=H,
        intermediate_size=32,
        max_length=40,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
    )
    return BertModel(config).eval()


NETWORKS = {"decoder": _decoder, "encoder-decoder": tiny_encoder_decoder, "bert": _bert}


@pytest.fixture(params=list(NETWORKS), name="network")
def _network(request) -> TextModule:
    return NETWORKS[request.param]()


def test_every_network_is_a_text_module_whose_layers_give_their_self_attention(network) -> None:
    assert isinstance(network, TextModule)
    stack = network.decoder if isinstance(network, DecoderLM) else network.encoder
    for i, layer in enumerate(stack.layers):
        assert isinstance(network.self_attention(i), MultiHeadAttention)
        assert network.self_attention(i) is layer.self_attn


def test_padding_leaves_each_rows_tokens_as_they_are_alone(network) -> None:
    """A row padded on the side the network allows (the left for a causal decoder, whose
    positions then count from the first token; the right for the encoders) gives the
    results of its tokens alone, and the weights of the layers asked for."""
    tokens = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 0, 0]])
    padding = torch.tensor([[True] * 5, [True, True, True, False, False]])
    own = slice(0, 3)
    if isinstance(network, DecoderLM):
        tokens, padding, own = tokens[:, [3, 4, 0, 1, 2]], padding[:, [3, 4, 0, 1, 2]], slice(2, 5)
    with torch.no_grad():
        out = network.last_hidden_state(tokens, padding=padding, return_weights=[1])
        alone = network.last_hidden_state(tokens[1:, own], return_weights=[1])
    assert isinstance(out, StackOutput) and isinstance(alone, StackOutput)
    torch.testing.assert_close(out.output[1:, own], alone.output, atol=1e-5, rtol=1e-5)
    assert out.weights[0] is None and out.weights[1] is not None
    weights, weights_alone = out.weights[1].self_attention, alone.weights[1].self_attention  # [1, h, s, s]
    torch.testing.assert_close(weights[1:, :, own, own], weights_alone, atol=1e-5, rtol=1e-5)
    assert (weights[1, :, own][..., padding[1] == 0] == 0).all()  # padding is never attended to


def test_logits_are_the_heads_or_none_for_encoders(network) -> None:
    tokens = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        hidden = network.last_hidden_state(tokens)
        logits = network.logits(hidden)
    if isinstance(network, DecoderLM):
        torch.testing.assert_close(logits, network(tokens))
    else:
        assert logits is None


def test_padding_of_another_shape_is_refused(network) -> None:
    with pytest.raises(ValueError, match=r"padding must be a bool tensor \[b, s\] = \[1, 3\]"):
        network.last_hidden_state(torch.tensor([[3, 4, 5]]), padding=torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="padding must be a bool tensor"):
        network.last_hidden_state(torch.tensor([[3, 4, 5]]), padding=torch.ones(1, 3))


def test_ids_that_are_not_integers_b_by_s_are_refused(network) -> None:
    with pytest.raises(TypeError, match="integer"):
        network.last_hidden_state(torch.tensor([[3.0, 4.0, 5.0]]))
    with pytest.raises(TypeError, match="integer"):
        network.last_hidden_state(torch.tensor([[True, False]]))
    with pytest.raises(ValueError, match=r"must be \[b, s\], got \[3\]"):
        network.last_hidden_state(torch.tensor([3, 4, 5]))


def test_a_decoders_padding_comes_without_mask_positions_or_cache() -> None:
    network, tokens = _decoder(), torch.tensor([[3, 4, 5]])
    padding = torch.ones(1, 3, dtype=torch.bool)
    for extra in (
        {"mask": padding[:, None, None, :]},
        {"positions": torch.arange(3)},
        {"kv_cache": network.new_kv_cache()},
    ):
        with pytest.raises(ValueError, match="padding sets the mask and the positions itself"):
            network.last_hidden_state(tokens, padding=padding, **extra)


def test_model_families_hold_no_function_that_runs_the_network() -> None:
    fields = {field.name for field in dataclasses.fields(ModelFamily)}
    assert not fields & {"hidden_states", "logits", "self_attention"}


def test_a_network_without_the_interface_cannot_be_made() -> None:
    class Incomplete(TextModule):
        def logits(self, hidden: torch.Tensor) -> None:
            return None

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()
