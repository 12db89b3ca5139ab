"""Transformer layers and stacks: parity with torch.nn.Transformer, returned weights,
cached decoding and errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit.nn import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    LayerConfig,
    LayerOutput,
    RelativePositionBias,
    RMSNorm,
    RotaryEmbedding,
    StackOutput,
    Transformer,
    TransformerConfig,
    TransformerOutput,
    mask_from_torch,
)
from tests.nn.helpers import (
    assert_close,
    assert_grads_match,
    padding_blocked,
    random_blocked,
    torch_transformer_grads,
)

E, H, FF = 16, 4, 32


# torch's own constructor warns that it cannot use nested tensors in these configurations.
NESTED_TENSOR_WARNING = "ignore:enable_nested_tensor is True"


@pytest.mark.filterwarnings(NESTED_TENSOR_WARNING)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("masking", ["padding", "attn_masks"])
def test_from_torch_matches_forward_and_gradients(batch_first: bool, norm_first: bool, masking: str) -> None:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    activation = "gelu" if norm_first else "relu"
    ref = nn.Transformer(
        E,
        H,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dim_feedforward=FF,
        dropout=0.0,
        activation=activation,
        batch_first=batch_first,
        norm_first=norm_first,
    )
    ours = Transformer.from_torch(ref)
    b, s_src, s_tgt = 3, 6, 5
    src = torch.randn(b, s_src, E, generator=g, requires_grad=True)
    tgt = torch.randn(b, s_tgt, E, generator=g, requires_grad=True)
    if masking == "padding":  # torch wants one mask type per call: bool with bool padding
        causal = torch.ones(s_tgt, s_tgt, dtype=torch.bool).triu(diagonal=1)
    else:
        causal = nn.Transformer.generate_square_subsequent_mask(s_tgt)  # float, -inf above the diagonal
    torch_masks: dict[str, torch.Tensor | None] = {"tgt_mask": causal}
    if masking == "padding":
        src_padding = padding_blocked([6, 4, 2], s_src)
        torch_masks |= dict(
            src_key_padding_mask=src_padding,
            memory_key_padding_mask=src_padding,
            tgt_key_padding_mask=padding_blocked([5, 5, 3], s_tgt),
        )
    else:
        torch_masks |= dict(src_mask=random_blocked(s_src, s_src, g), memory_mask=random_blocked(s_tgt, s_src, g))

    def to_torch(t: torch.Tensor) -> torch.Tensor:
        return t if batch_first else t.transpose(0, 1)

    expected = to_torch(ref(to_torch(src), to_torch(tgt), **torch_masks))
    result = ours(
        src,
        tgt,
        src_mask=mask_from_torch(torch_masks.get("src_mask"), torch_masks.get("src_key_padding_mask")),
        tgt_mask=mask_from_torch(None, torch_masks.get("tgt_key_padding_mask")),
        memory_mask=mask_from_torch(torch_masks.get("memory_mask"), torch_masks.get("memory_key_padding_mask")),
        causal=True,
    )
    assert_close(result, expected)

    upstream = torch.randn(expected.shape, generator=g)
    ref_grads = torch.autograd.grad(expected, (src, tgt), upstream, retain_graph=True)
    our_grads = torch.autograd.grad(result, (src, tgt), upstream, retain_graph=True)
    for ours_g, ref_g in zip(our_grads, ref_grads):
        assert_close(ours_g, ref_g)
    (expected * upstream).sum().backward(inputs=list(ref.parameters()))
    (result * upstream).sum().backward(inputs=list(ours.parameters()))
    assert_grads_match(ours, torch_transformer_grads(ref))


def test_layer_from_torch_keeps_the_configuration() -> None:
    ref = nn.TransformerEncoderLayer(
        E, H, FF, dropout=0.2, activation="gelu", layer_norm_eps=1e-6, norm_first=True, bias=False
    )
    layer = EncoderLayer.from_torch(ref)
    assert layer.norm_first and layer.ff.activation == "gelu" and layer.dropout.p == 0.2
    assert layer.self_attn_norm.eps == 1e-6 and layer.self_attn.q_proj.bias is None
    ref.eval(), layer.eval()
    x = torch.randn(2, 5, E)
    with torch.no_grad():
        assert_close(layer(x), ref(x.transpose(0, 1)).transpose(0, 1))
    with pytest.raises(ValueError, match="ReLU and exact GELU"):
        EncoderLayer.from_torch(nn.TransformerEncoderLayer(E, H, FF, activation=torch.tanh))
    with pytest.raises(TypeError, match="TransformerDecoderLayer"):
        DecoderLayer.from_torch(ref)


@pytest.mark.slow
@pytest.mark.filterwarnings(NESTED_TENSOR_WARNING)
def test_defaults_are_the_base_model() -> None:
    model = Transformer()
    assert len(model.encoder.layers) == len(model.decoder.layers) == 6
    layer = model.encoder.layers[0]
    assert layer.self_attn.embed_dim == 512 and layer.self_attn.num_heads == 8
    assert layer.ff.up_proj.out_features == 2048 and layer.dropout.p == 0.1
    assert not layer.norm_first and model.encoder.final_norm is None
    reference = nn.Transformer()
    torch_params = sum(p.numel() for p in reference.parameters()) - 2 * 2 * 512  # torch adds final norms
    assert sum(p.numel() for p in model.parameters()) == torch_params


def test_every_layer_returns_its_weights() -> None:
    torch.manual_seed(1)
    model = Transformer(TransformerConfig(E, H, FF, num_encoder_layers=2, num_decoder_layers=3, dropout=0.0))
    src, tgt = torch.randn(2, 6, E), torch.randn(2, 4, E)
    result = model(src, tgt, return_weights=True)
    assert isinstance(result, TransformerOutput)
    assert_close(result.output, model(src, tgt))
    assert len(result.encoder_weights) == 2 and len(result.decoder_weights) == 3
    for w in result.encoder_weights:
        assert w.self_attention.shape == (2, H, 6, 6) and w.cross_attention is None
    for w in result.decoder_weights:
        assert w.self_attention.shape == (2, H, 4, 4) and w.cross_attention.shape == (2, H, 4, 6)
        assert torch.all(w.self_attention.triu(diagonal=1) == 0)  # causal
        assert_close(w.cross_attention.sum(-1), torch.ones(2, H, 4))
    layer_out = model.encoder.layers[0](src, return_weights=True)
    assert isinstance(layer_out, LayerOutput) and layer_out.weights.self_attention.shape == (2, H, 6, 6)
    assert not any(isinstance(v, torch.Tensor) for m in model.modules() for v in vars(m).values())


def test_encoder_without_positions_is_permutation_equivariant() -> None:
    torch.manual_seed(2)
    encoder = Encoder([EncoderLayer(LayerConfig(E, H, FF, dropout=0.0, num_kv_heads=2)) for _ in range(2)])
    x = torch.randn(2, 7, E)
    perm = torch.randperm(7)
    assert_close(encoder(x[:, perm]), encoder(x)[:, perm])


def test_causal_decoder_output_ignores_later_tokens() -> None:
    torch.manual_seed(3)
    model = Transformer(TransformerConfig(E, H, FF, num_encoder_layers=1, num_decoder_layers=2, dropout=0.0))
    src, tgt = torch.randn(1, 5, E), torch.randn(1, 6, E)
    changed = tgt.clone()
    changed[:, 4:] = torch.randn(1, 2, E)
    assert_close(model(src, changed)[:, :4], model(src, tgt)[:, :4])


def test_incremental_decoding_equals_teacher_forcing() -> None:
    torch.manual_seed(4)
    model = Transformer(
        TransformerConfig(
            E, H, FF, num_encoder_layers=2, num_decoder_layers=2, dropout=0.0, num_kv_heads=2, norm_first=True
        )
    )
    src, tgt = torch.randn(2, 5, E), torch.randn(2, 6, E)
    src_padding = torch.tensor([[True] * 5, [True] * 3 + [False] * 2]).view(2, 1, 1, 5)
    full = model(src, tgt, src_mask=src_padding, memory_mask=src_padding)
    memory = model.encode(src, src_mask=src_padding)
    cache = model.new_kv_cache()
    steps = [model.decode(tgt[:, :2], memory, memory_mask=src_padding, kv_cache=cache)]
    steps += [model.decode(tgt[:, i : i + 1], memory, memory_mask=src_padding, kv_cache=cache) for i in range(2, 6)]
    assert len(cache) == 6
    assert_close(torch.cat(steps, dim=1), full)


def test_decoder_only_stack_with_rotary_gqa_rms_swiglu_caches() -> None:
    torch.manual_seed(5)
    rope = RotaryEmbedding(E // H, theta=1e5)
    decoder = Decoder(
        [
            DecoderLayer(
                LayerConfig(
                    E, H, FF, num_kv_heads=1, dropout=0.0, activation="swiglu", norm="rms", norm_first=True, bias=False
                ),
                cross_attention=False,
                positional=rope,
            )
            for _ in range(3)
        ],
        final_norm=RMSNorm(E),
    )
    x = torch.randn(2, 7, E)
    full = decoder(x, return_weights=True)
    assert isinstance(full, StackOutput) and len(full.weights) == 3
    cache = decoder.new_kv_cache()
    steps = [decoder(x[:, :3], kv_cache=cache)] + [decoder(x[:, i : i + 1], kv_cache=cache) for i in range(3, 7)]
    assert_close(torch.cat(steps, dim=1), full.output)
    assert set(decoder.state_dict()) == {name for name, _ in decoder.named_parameters()}


def test_encoder_returns_the_weights_of_chosen_layers_only() -> None:
    torch.manual_seed(6)
    encoder = Encoder([EncoderLayer(LayerConfig(E, H, FF, dropout=0.0)) for _ in range(3)]).eval()
    x = torch.randn(2, 5, E)
    full = encoder(x, return_weights=True)
    chosen = encoder(x, return_weights=(2, 0))
    assert chosen.weights[1] is None
    for i in (0, 2):
        assert_close(chosen.weights[i].self_attention, full.weights[i].self_attention)
    assert_close(chosen.output, full.output)
    assert isinstance(encoder(x, return_weights=[]), StackOutput)
    last = encoder(x, return_weights=[-1])  # negative indices count from the end
    assert last.weights[:2] == [None, None]
    assert_close(last.weights[2].self_attention, full.weights[2].self_attention)
    with pytest.raises(ValueError, match=r"layer -4 is out of range: the stack has 3 layers, 0\.\.2"):
        encoder(x, return_weights=[-4])


def test_errors() -> None:
    with pytest.raises(ValueError, match="at least one EncoderLayer"):
        Encoder([])
    with pytest.raises(TypeError, match="layer 0 must be a DecoderLayer"):
        Decoder([EncoderLayer(LayerConfig(E, H, FF))])
    with pytest.raises(ValueError, match="either every decoder layer has cross-attention or none"):
        Decoder([DecoderLayer(LayerConfig(E, H, FF)), DecoderLayer(LayerConfig(E, H, FF), cross_attention=False)])
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads"):
        Transformer(TransformerConfig(10, 4))
    layer = DecoderLayer(LayerConfig(E, H, FF))
    with pytest.raises(ValueError, match="memory is required"):
        layer(torch.randn(1, 3, E))
    with pytest.raises(ValueError, match="memory is required"):
        DecoderLayer(LayerConfig(E, H, FF), cross_attention=False)(torch.randn(1, 3, E), torch.randn(1, 3, E))
    decoder = Decoder([layer])
    with pytest.raises(ValueError, match="cache has 2 layers, this decoder has 1"):
        decoder(
            torch.randn(1, 3, E),
            torch.randn(1, 3, E),
            kv_cache=Decoder([layer, DecoderLayer(LayerConfig(E, H, FF))]).new_kv_cache(),
        )
    with pytest.raises(ValueError, match="norm must be"):
        EncoderLayer(LayerConfig(E, H, FF, norm="batch"))


@pytest.mark.filterwarnings(NESTED_TENSOR_WARNING)
def test_layers_from_torch_keep_float64_weights_exactly() -> None:
    torch.manual_seed(0)
    encoder_layer = nn.TransformerEncoderLayer(E, H, FF, batch_first=True, dtype=torch.float64)
    ours = EncoderLayer.from_torch(encoder_layer)
    assert torch.equal(ours.self_attn.k_proj.weight, encoder_layer.self_attn.in_proj_weight[E : 2 * E])
    assert torch.equal(ours.ff.up_proj.weight, encoder_layer.linear1.weight)
    assert torch.equal(ours.ff_norm.weight, encoder_layer.norm2.weight)
    decoder_layer = nn.TransformerDecoderLayer(E, H, FF, batch_first=True, dtype=torch.float64)
    ours_dec = DecoderLayer.from_torch(decoder_layer)
    assert torch.equal(ours_dec.cross_attn.q_proj.weight, decoder_layer.multihead_attn.in_proj_weight[:E])
    assert torch.equal(ours_dec.ff.down_proj.weight, decoder_layer.linear2.weight)
    assert all(p.dtype == torch.float64 for p in ours_dec.parameters())


def test_layers_with_memory_bounded_kernels_build_with_the_default_dropout() -> None:
    # The default dropout applies to the residual and feed-forward paths; kernels that never
    # materialise the weights have no attention dropout.
    layer = EncoderLayer(LayerConfig(32, 4, 64, kernel="tiled"))
    assert layer.self_attn.dropout == 0.0 and layer.dropout.p == 0.1
    decoder = DecoderLayer(LayerConfig(32, 4, 64, kernel="local", kernel_options={"window": 3}))
    assert decoder.self_attn.kernel_options == {"window": 3}
    x = torch.randn(2, 7, 32)
    assert decoder.eval()(x, torch.randn(2, 5, 32)).shape == (2, 7, 32)
    with pytest.raises(ValueError, match="attention_dropout"):
        EncoderLayer(LayerConfig(32, 4, 64, kernel="tiled", attention_dropout=0.1))


def test_kernel_options_are_checked_when_the_module_is_built() -> None:
    with pytest.raises(TypeError, match="kernel 'local' needs the option 'window'"):
        EncoderLayer(LayerConfig(32, 4, 64, kernel="local"))
    with pytest.raises(TypeError, match="kernel 'tiled' takes no option 'window'"):
        Transformer(
            TransformerConfig(
                32, 4, 64, num_encoder_layers=1, num_decoder_layers=1, kernel="tiled", kernel_options={"window": 3}
            )
        )
    with pytest.raises(ValueError, match="window must be >= 0"):
        EncoderLayer(LayerConfig(32, 4, 64, kernel="local", kernel_options={"window": -1}))


def test_module_hooks_on_layers_and_attention_run_inside_stacks() -> None:
    encoder = Encoder([EncoderLayer(LayerConfig(E, H, FF, dropout=0.0)) for _ in range(2)]).eval()
    seen = []
    for i, layer in enumerate(encoder.layers):
        layer.register_forward_hook(lambda module, args, out, i=i: seen.append(("layer", i)))
        layer.self_attn.register_forward_hook(lambda module, args, out, i=i: seen.append(("attention", i)))
    x = torch.randn(1, 3, E)
    encoder(x)
    encoder(x, return_weights=[1])
    assert seen == [("attention", 0), ("layer", 0), ("attention", 1), ("layer", 1)] * 2


def _relative_stacks(shared: bool) -> tuple[Encoder, Decoder]:
    """T5-like stacks of 3 + 3 layers whose self-attentions share one relative position
    bias per stack (or hold one each, with the same weights), the same weights either way."""
    config = LayerConfig(E, H, FF, dropout=0.0, norm="rms", norm_first=True, bias=False)
    torch.manual_seed(7)
    tables = [RelativePositionBias(H, num_buckets=8, max_distance=16, bidirectional=b) for b in (True, False)]

    def copies(table: RelativePositionBias) -> list[RelativePositionBias]:
        if shared:
            return [table] * 3
        own = [
            RelativePositionBias(H, num_buckets=8, max_distance=16, bidirectional=table.bidirectional) for _ in range(3)
        ]
        for copy in own:
            copy.load_state_dict(table.state_dict())
        return own

    encodings, decodings = copies(tables[0]), copies(tables[1])
    torch.manual_seed(8)
    encoder = Encoder([EncoderLayer(config, positional=p) for p in encodings], final_norm=RMSNorm(E))
    decoder = Decoder([DecoderLayer(config, positional=p) for p in decodings], final_norm=RMSNorm(E))
    return encoder, decoder


def test_a_shared_bias_encoding_is_computed_once_per_forward_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    shared_encoder, shared_decoder = _relative_stacks(shared=True)
    own_encoder, own_decoder = _relative_stacks(shared=False)
    calls = []
    original = RelativePositionBias.score_bias

    def counted(self: RelativePositionBias, s_q: int, s_k: int, **kwargs: object) -> torch.Tensor:
        calls.append((s_q, s_k))
        return original(self, s_q, s_k, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(RelativePositionBias, "score_bias", counted)
    src, tgt = torch.randn(2, 5, E), torch.randn(2, 4, E)
    memory = shared_encoder(src)
    assert calls == [(5, 5)]
    assert_close(memory, own_encoder(src))  # each layer computing its own bias: the same result
    calls.clear()
    cache = shared_decoder.new_kv_cache()
    steps = [shared_decoder(tgt[:, :2], memory, kv_cache=cache)]
    steps += [shared_decoder(tgt[:, i : i + 1], memory, kv_cache=cache) for i in (2, 3)]
    assert calls == [(2, 2), (1, 3), (1, 4)]  # once per step, the new queries against every key
    assert_close(torch.cat(steps, dim=1), own_decoder(tgt, memory))


def test_the_shared_bias_takes_the_gradient_of_every_layer() -> None:
    shared_encoder, _ = _relative_stacks(shared=True)
    own_encoder, _ = _relative_stacks(shared=False)
    x = torch.randn(2, 6, E)
    shared_encoder(x).square().sum().backward()
    own_encoder(x).square().sum().backward()
    table = shared_encoder.layers[0].self_attn.positional.weight.grad
    per_layer = [layer.self_attn.positional.weight.grad for layer in own_encoder.layers]
    assert_close(table, sum(per_layer))


def test_attention_refuses_a_position_bias_that_is_not_its_own() -> None:
    config = LayerConfig(E, H, FF, dropout=0.0)
    x = torch.randn(1, 3, E)
    plain = EncoderLayer(config)
    with pytest.raises(ValueError, match=r"position_bias must be the score bias \[1, h, s_q, s_k\] = \[1, 4, 3, 3\]"):
        plain(x, position_bias=torch.zeros(1, H, 3, 3))
    relative = EncoderLayer(config, positional=RelativePositionBias(H, num_buckets=8, max_distance=16))
    with pytest.raises(ValueError, match=r"got \[1, 4, 3, 2\] for positional=RelativePositionBias"):
        relative(x, position_bias=torch.zeros(1, H, 3, 2))
    bias = relative.self_attn.positional.score_bias(3, 3, device=x.device, dtype=x.dtype)
    assert_close(relative(x, position_bias=bias), relative(x))


def test_selected_layers_is_a_deprecated_reading_of_the_one_selector() -> None:
    from attnkit.nn import selected_layers

    with pytest.warns(DeprecationWarning, match="select_indices"):
        assert selected_layers([-1, 0, 0], 3) == frozenset({0, 2})
    with pytest.warns(DeprecationWarning):
        assert selected_layers(False, 3) is None
