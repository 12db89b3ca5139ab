"""Processed weights (fold_ln, center_writing_weights, center_unembed, fold_value_biases)
against their definitions, on tiny random checkpoints: each block computed by hand from the
processed weights and the normalised stream (``(x - mean) / scale`` after LayerNorm,
``x / scale`` after RMSNorm, the scale the norm's hook point recorded) equals what the model
computed, less its mean over the model dim where the writing weights are centred, and the
logits less their mean over the vocabulary."""

from __future__ import annotations

import pytest
import torch

from attnkit import models
from attnkit.models.model.lens import per_query_head

pytest.importorskip("transformers")

TEXT = "w3 w17 w5 w99 w42 w8 w61 w23 w70 w1"
# LayerNorm (GPT-2, GPT-NeoX's parallel layers), RMSNorm (LLaMA 3, Qwen 2 with q/k/v biases),
# Gemma 2's RMSNorm scaled by 1 + weight, with norms of the block outputs and soft-capping.
CASES = ["gpt2", "gpt_neox", "llama_llama3", "qwen2", "gemma2"]


@pytest.fixture(scope="module", params=CASES)
def case(request, tiny_family_folder):
    """``(model, processed weights, cache, normalised stream function)`` of one family."""
    model = models.load(tiny_family_folder(request.param))
    _, cache = model.run_with_cache(TEXT)
    return model, model.processed_weights(), cache


def pre(model, cache, stream, scale_name):
    """The stream normalised without the norm's weight or bias, by the scale it recorded."""
    centred = stream - stream.mean(-1, keepdim=True) if model.processed_weights().norm == "layer_pre" else stream
    return centred / cache[scale_name]


def centred(model, tensor):
    """``tensor`` less its mean over the model dim where the writing weights are centred."""
    if "center_writing_weights" in model.processed_weights().applied:
        return tensor - tensor.mean(-1, keepdim=True)
    return tensor


def assert_close(got, expected):
    got, expected = got.detach(), expected.detach()
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()) + 1e-6), float(
        (got - expected).abs().max()
    )


def test_the_steps_that_apply_to_each_norm(case):
    model, processed, _ = case
    layer_norm = model.family in ("gpt2", "gpt_neox")
    assert processed.norm == ("layer_pre" if layer_norm else "rms_pre")
    writing = ("center_writing_weights",) if layer_norm else ()
    assert processed.applied == ("fold_ln", *writing, "center_unembed", "fold_value_biases")
    for name in ("W_Q", "W_K", "W_V", "W_O", "W_in", "W_out", "W_U", "b_O", "b_V"):
        assert getattr(processed, name).shape == getattr(model, name).shape, name
    assert torch.equal(processed.b_V, torch.zeros_like(model.b_V))
    assert torch.allclose(processed.W_U.mean(-1), torch.zeros(()), atol=1e-6)


def test_nothing_asked_gives_the_raw_weights(case):
    model, _, _ = case
    raw = model.processed_weights(
        fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False
    )
    assert raw.applied == () and raw.norm is None
    for name in ("W_E", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_out", "W_U", "b_Q", "b_V", "b_O", "b_in", "b_U"):
        assert torch.equal(getattr(raw, name), getattr(model, name)), name


def test_folded_reading_weights_on_the_normalised_stream_give_the_projections(case):
    model, w, cache = case
    for layer in range(model.num_layers):
        block = model.module.decoder.layers[layer]
        x = cache["resid_pre", layer]
        normed = block.self_attn_norm(x)  # the model's norm, weight and bias included
        x_pre = pre(model, cache, x, model.hook_name("self_attn_norm.scale", layer))
        for name in ("Q", "K"):
            raw = torch.einsum("bse,hed->bhsd", normed, getattr(model, f"W_{name}")[layer])
            raw = raw + getattr(model, f"b_{name}")[layer][:, None]
            folded = torch.einsum("bse,hed->bhsd", x_pre, getattr(w, f"W_{name}")[layer])
            assert_close(folded + getattr(w, f"b_{name}")[layer][:, None], raw)
        mid = x if block.resid_mid is None else cache["resid_mid", layer]  # a parallel layer reads x
        ff_pre = pre(model, cache, mid, model.hook_name("ff_norm.scale", layer))
        up = ff_pre @ w.W_in[layer] + w.b_in[layer]
        if w.W_gate is None:
            assert_close(up, cache["ff.pre", layer])
        else:
            assert_close(ff_pre @ w.W_gate[layer], cache["ff.pre", layer])
            assert_close(up, block.ff.up_proj(block.ff_norm(mid)))


# Not Gemma 2: its norms of the block outputs stand between W_O, W_out and the stream, so a
# block's output is not a product of processed weights (its projections are checked above).
@pytest.mark.parametrize("case", [c for c in CASES if c != "gemma2"], indirect=True)
def test_blocks_written_with_processed_weights_equal_the_models_less_their_mean(case):
    model, w, cache = case
    assert model.module.decoder.layers[0].self_attn_out_norm is None
    ids = model.prepare_input(TEXT)[0]
    embed = w.W_E[ids] * model.embedding_scale + (0 if w.W_pos is None else w.W_pos[: ids.shape[1]])
    assert_close(embed, centred(model, cache["embed"]))
    for layer in range(model.num_layers):
        x_pre = pre(model, cache, cache["resid_pre", layer], model.hook_name("self_attn_norm.scale", layer))
        values = torch.einsum("bse,hed->bhsd", x_pre, per_query_head(w.W_V, model.num_heads)[layer])
        values = values + per_query_head(w.b_V, model.num_heads)[layer][:, None]  # zeros: folded into b_O
        z = cache["pattern", layer] @ values  # [b, h, s, d]
        attn_out = torch.einsum("bhsd,hde->bse", z, w.W_O[layer]) + w.b_O[layer]
        assert_close(attn_out, centred(model, cache["attn_out", layer]))
        mlp_out = cache["ff.post", layer] @ w.W_out[layer] + w.b_out[layer]
        assert_close(mlp_out, centred(model, cache["mlp_out", layer]))


def test_the_unembedding_gives_the_logits_less_their_mean(case):
    model, w, cache = case
    last = cache["resid_post", model.num_layers - 1]
    logits = pre(model, cache, last, model.hook_name("final_norm.scale")) @ w.W_U + w.b_U
    before_cap = model.module.lm_head(cache["decoder.final"])  # [b, s, v], before Gemma 2's soft-capping
    assert_close(logits, before_cap - before_cap.mean(-1, keepdim=True))
    # The same log-probabilities where no soft-capping follows.
    if model.final_transform is None:
        assert_close(logits.log_softmax(-1), before_cap.log_softmax(-1))


def test_a_model_that_is_not_a_pre_norm_decoder_is_refused(tiny_t5):
    with pytest.raises(ValueError, match="need a pre-norm decoder"):
        tiny_t5.processed_weights()
