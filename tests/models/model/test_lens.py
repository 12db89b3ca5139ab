"""TransformerLens-style weights, token helpers, losses and the logit lens
(attnkit.models.model.lens) against independent computations: the checkpoint's own tensors read
through transformers' modules (each family's own names and layouts: GPT-2's Conv1D,
GPT-NeoX's interleaved q/k/v, Phi-3's fused projections), transformers' loss, and the
model's own logits."""

from __future__ import annotations

import pytest
import torch

from attnkit import models
from attnkit.models.model.lens import lm_cross_entropy, per_query_head
from tests.fixtures.tiny_families import CASES

transformers = pytest.importorskip("transformers")

TEXT = "w3 w17 w5 w99 w42 w8 w61 w23 w70 w1 w5 w99"
ATOL = 1e-6


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tiny_family_folder):
    """``(attnkit model, transformers model)`` of one family's tiny checkpoint."""
    folder = tiny_family_folder(request.param)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    return models.load(folder), hf


def _linear(module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight [out, in], bias)`` of an nn.Linear or of GPT-2's Conv1D (stored ``[in, out]``)."""
    if type(module).__name__ == "Conv1D":
        return module.weight.detach().T, module.bias.detach()
    return module.weight.detach(), None if module.bias is None else module.bias.detach()


def hf_weights(hf, model) -> dict[str, object]:
    """Every TransformerLens weight, from transformers' modules of each family in their own
    layout: ``{"W_Q": [L, h, e, d], ...}`` (``None`` where the family has none)."""
    h, h_kv = model.num_heads, model.num_kv_heads
    kind = hf.config.model_type
    base = hf.base_model
    layers = base.h if kind == "gpt2" else base.layers
    out: dict[str, list] = {name: [] for name in ("Q", "K", "V", "O", "in", "gate", "out")}
    biases: dict[str, list] = {name: [] for name in ("Q", "K", "V", "O", "in", "out")}
    for layer in layers:
        if kind == "gpt2":
            qkv, qkv_bias = _linear(layer.attn.c_attn)  # [3e, e]
            parts = qkv.chunk(3)
            part_biases = qkv_bias.chunk(3)
            o, o_bias = _linear(layer.attn.c_proj)
            up, up_bias = _linear(layer.mlp.c_fc)
            gate = None
            down, down_bias = _linear(layer.mlp.c_proj)
        elif kind == "gpt_neox":
            qkv, qkv_bias = _linear(layer.attention.query_key_value)  # [h * 3 * d, e], per head q, k, v
            d = qkv.shape[0] // (3 * h)
            per_head = qkv.view(h, 3, d, -1)
            parts = [per_head[:, i].reshape(h * d, -1) for i in range(3)]
            part_biases = [qkv_bias.view(h, 3, d)[:, i].reshape(-1) for i in range(3)]
            o, o_bias = _linear(layer.attention.dense)
            up, up_bias = _linear(layer.mlp.dense_h_to_4h)
            gate = None
            down, down_bias = _linear(layer.mlp.dense_4h_to_h)
        elif kind == "phi3":
            qkv, _ = _linear(layer.self_attn.qkv_proj)
            d = layer.self_attn.head_dim
            parts = qkv.split([h * d, h_kv * d, h_kv * d])
            part_biases = [None] * 3
            o, o_bias = _linear(layer.self_attn.o_proj)
            gate, up = _linear(layer.mlp.gate_up_proj)[0].chunk(2)  # gate first
            up_bias = None
            down, down_bias = _linear(layer.mlp.down_proj)
        else:
            attention = layer.self_attn
            projections = [_linear(getattr(attention, f"{x}_proj")) for x in "qkv"]
            parts = [w for w, _ in projections]
            part_biases = [b for _, b in projections]
            o, o_bias = _linear(attention.o_proj)
            gate = _linear(layer.mlp.gate_proj)[0]
            up, up_bias = _linear(layer.mlp.up_proj)
            down, down_bias = _linear(layer.mlp.down_proj)
        for name, w, heads in zip("QKV", parts, (h, h_kv, h_kv)):
            out[name].append(w.view(heads, -1, w.shape[1]).transpose(1, 2))  # [heads, e, d]
        for name, b, w, heads in zip("QKV", part_biases, parts, (h, h_kv, h_kv)):
            biases[name].append(torch.zeros(w.shape[0]).view(heads, -1) if b is None else b.view(heads, -1))
        out["O"].append(o.T.reshape(h, -1, o.shape[0]))  # [h, d, e]
        biases["O"].append(torch.zeros(o.shape[0]) if o_bias is None else o_bias)
        out["in"].append(up.T)
        out["gate"].append(None if gate is None else gate.T)
        out["out"].append(down.T)
        biases["in"].append(torch.zeros(up.shape[0]) if up_bias is None else up_bias)
        biases["out"].append(torch.zeros(down.shape[0]) if down_bias is None else down_bias)
    result: dict[str, object] = {f"W_{k}": torch.stack(v) for k, v in out.items() if k != "gate"}
    result["W_gate"] = None if out["gate"][0] is None else torch.stack(out["gate"])
    result |= {f"b_{k}": torch.stack(v) for k, v in biases.items()}
    result["W_E"] = hf.get_input_embeddings().weight.detach()
    result["W_U"] = hf.get_output_embeddings().weight.detach().T
    result["W_pos"] = base.wpe.weight.detach() if kind == "gpt2" else None
    return result


def test_weights_equal_the_checkpoints_own_tensors(pair):
    model, hf = pair
    expected = hf_weights(hf, model)
    for name, want in expected.items():
        got = getattr(model, name)
        if want is None:
            assert got is None, name
            continue
        assert got is not None and got.shape == want.shape, (name, None if got is None else got.shape, want.shape)
        assert torch.allclose(got, want, atol=ATOL), name
    assert torch.equal(model.b_U, torch.zeros(model.config.vocab_size))


def test_weights_compute_the_cached_activations(pair):
    """``v = norm(x) W_V + b_V`` and ``result = z W_O``, on the model's own cache."""
    model, _ = pair
    _, cache = model.run_with_cache(TEXT)
    layer = model.module.decoder.layers[1]
    normed = layer.self_attn_norm(cache["resid_pre", 1])  # [1, s, e]
    value = normed[0] @ model.W_V[1, 0] + model.b_V[1, 0]  # [s, d]
    assert torch.allclose(cache["v", 1][0, 0], value, atol=1e-5)
    result = cache["z", 1][0, 1] @ model.W_O[1, 1]  # [s, e]
    assert torch.allclose(cache["result", 1][0, 1], result, atol=1e-5)


def test_per_query_head_repeats_key_value_heads():
    weights = torch.arange(2 * 3).view(1, 2, 3)
    assert per_query_head(weights, 4)[0, :, 0].tolist() == [0, 0, 3, 3]
    with pytest.raises(ValueError, match="multiple"):
        per_query_head(weights, 3)


def test_loss_equals_transformers_loss(pair):
    model, hf = pair
    ids = model.tokenize(TEXT).ids
    with torch.no_grad():
        expected = hf(ids, labels=ids).loss
        per_token = model.loss(ids, per_token=True)
        mean = model.loss(TEXT)
    assert per_token.shape == (1, ids.shape[1] - 1)
    assert abs(float(mean) - float(expected)) < 1e-5
    assert abs(float(per_token.mean()) - float(expected)) < 1e-5


def test_loss_of_a_padded_batch_counts_each_rows_tokens():
    logits = torch.randn(2, 4, 7)
    ids = torch.tensor([[1, 2, 3, 0], [4, 5, 6, 2]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    losses = lm_cross_entropy(logits, ids, per_token=True, attention_mask=mask)
    assert losses[0, 2] == 0 and losses[1, 2] > 0
    alone = lm_cross_entropy(logits[:1, :3], ids[:1, :3], per_token=True)
    assert torch.allclose(losses[0, :2], alone[0])
    mean = lm_cross_entropy(logits, ids, attention_mask=mask)
    assert torch.allclose(mean, losses.sum() / 5)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        lm_cross_entropy(logits[:, :1], ids[:, :1])


def test_token_helpers(pair):
    model, _ = pair
    assert model.to_str_tokens(TEXT) == TEXT.split()
    ids = model.tokenize(TEXT).ids
    assert model.to_str_tokens(ids[0].tolist()) == TEXT.split()
    assert model.to_string(ids[0]) == TEXT
    assert model.to_string(torch.cat([ids, ids])) == [TEXT, TEXT]
    assert model.get_token_position("w5", TEXT) == 2
    assert model.get_token_position("w5", TEXT, mode="last") == 10
    assert model.get_token_position(model.to_single_token("w99"), ids, mode="last") == 11
    with pytest.raises(ValueError, match="does not occur"):
        model.get_token_position("w2", TEXT)
    with pytest.raises(ValueError, match="mode"):
        model.get_token_position("w5", TEXT, mode="middle")  # type: ignore[arg-type]
    directions = model.tokens_to_residual_directions(torch.tensor([[3, 5]]))
    assert directions.shape == (1, 2, model.config.hidden_size)
    assert torch.equal(directions[0, 1], model.W_U[:, 5])
    assert torch.equal(model.tokens_to_residual_directions("w5"), model.W_U[:, model.to_single_token("w5")])


def test_accumulated_bias_is_what_the_blocks_add_to_a_zero_input(pair):
    """With every block's norm giving zeros and every feed-forward's hidden activation
    zeroed, each block adds only its biases (a value bias through ``W_O``, as each pattern
    row sums to 1): the stream into layer ``l`` is the embedding plus ``accumulated_bias(l)``.
    Gemma's blocks have no biases and norm their outputs: zero in, zero out, a zero sum."""
    model, _ = pair
    if model.config.output_norms:
        assert not model.accumulated_bias(model.num_layers).any()
    ids = model.tokenize(TEXT).ids
    norms = [m for n, m in model.module.named_modules() if n.endswith(("self_attn_norm", "ff_norm"))]
    handles = [m.register_forward_hook(lambda m, a, out: torch.zeros_like(out)) for m in norms]
    hooks = {name: (lambda x: torch.zeros_like(x)) for name in model.hook_names() if name.endswith("ff.post")}
    try:
        with model.hooks(hooks):
            cache = model.run(ids, return_weights=False, names_filter=None).cache
    finally:
        for handle in handles:
            handle.remove()
    for layer in range(1, model.num_layers):
        got = cache["resid_pre", layer] - cache["embed"]  # [1, s, e]
        assert torch.allclose(got, model.accumulated_bias(layer).expand_as(got), atol=1e-5), layer
    got = cache["resid_mid", 0] - cache["embed"] if "decoder.layers.0.resid_mid" in cache else None
    if got is not None:
        assert torch.allclose(got, model.accumulated_bias(0, mlp_input=True).expand_as(got), atol=1e-5)
    with pytest.raises(ValueError, match="layer must be in"):
        model.accumulated_bias(model.num_layers + 1)


@pytest.mark.parametrize("case", ["gemma2", "llama_linear", "gpt2"])
def test_logit_lens_ends_at_the_models_logits(tiny_family_folder, case):
    """The last lens entry is the model's own logits, Gemma 2's soft-capping included."""
    model = models.load(tiny_family_folder(case))
    logits, cache = model.run_with_cache(TEXT)
    lens, labels = model.logit_lens(cache)
    assert labels[-1] == "final_post" and lens.shape == (model.num_layers + 1, *logits.shape)
    assert (lens[-1] - logits).abs().max() < 1e-5
    mid, mid_labels = model.logit_lens(cache, incl_mid=True)
    assert len(mid_labels) == 2 * model.num_layers + 1 and torch.allclose(mid[-1], lens[-1])


@pytest.mark.parametrize("case", ["gemma2", "llama_linear", "gpt2"])
def test_logit_attribution_states_its_residual(tiny_family_folder, case):
    model = models.load(tiny_family_folder(case))
    logits, cache = model.run_with_cache(TEXT)
    target, wrong = model.to_single_token("w5"), model.to_single_token("w8")
    for by in ("block", "head"):
        dla = model.logit_attribution(cache, "w5", "w8", by=by)
        expected = logits[..., target] - logits[..., wrong]
        assert torch.allclose(dla.logit, expected, atol=1e-5)
        assert torch.allclose(dla.attributions.sum(0) + dla.residual, expected, atol=1e-5)
    dla = model.logit_attribution(cache, target)
    if case == "gemma2":
        # The parts sum to the logit before the soft-capping; the residual is the cap's effect.
        assert not dla.exact and dla.final_transform == "softcap(1.5)"
        capped = model.unembed(cache["decoder.final"])[..., target]
        uncapped = cache["decoder.final"] @ model.W_U[:, target]
        assert torch.allclose(dla.attributions.sum(0), uncapped, atol=1e-4)
        assert torch.allclose(dla.residual, capped - uncapped, atol=1e-4)
        assert dla.residual.abs().max() > 0.1
    else:
        assert dla.exact and dla.final_transform is None
        bias = getattr(model.module.decoder.final_norm, "bias", None)
        unowned = 0.0 if bias is None else bias.detach() @ model.W_U[:, target]
        assert torch.allclose(dla.residual, torch.full_like(dla.residual, float(unowned)), atol=1e-4)
    with pytest.raises(ValueError, match="by must be"):
        model.logit_attribution(cache, target, by="layer")  # type: ignore[arg-type]


@pytest.mark.slow
def test_smollm2_weights_tokens_and_loss_equal_transformers(smollm2, hf_smollm2):
    hf, tokenizer = hf_smollm2
    layer = hf.model.layers[7]
    h, h_kv, d = 9, 3, 64
    assert torch.equal(smollm2.W_E, hf.model.embed_tokens.weight.detach())
    assert torch.equal(smollm2.W_U, hf.lm_head.weight.detach().T)
    assert smollm2.W_pos is None and torch.equal(smollm2.b_Q, torch.zeros(30, h, d))
    assert torch.equal(smollm2.W_Q[7, 4], layer.self_attn.q_proj.weight.detach()[4 * d : 5 * d].T)
    assert torch.equal(smollm2.W_K[7, 2], layer.self_attn.k_proj.weight.detach()[2 * d : 3 * d].T)
    assert smollm2.W_V.shape == (30, h_kv, 576, d) and smollm2.W_O.shape == (30, h, d, 576)
    assert torch.equal(smollm2.W_O[7, 4], layer.self_attn.o_proj.weight.detach()[:, 4 * d : 5 * d].T)
    assert torch.equal(smollm2.W_gate[7], layer.mlp.gate_proj.weight.detach().T)
    assert torch.equal(smollm2.W_in[7], layer.mlp.up_proj.weight.detach().T)
    assert torch.equal(smollm2.W_out[7], layer.mlp.down_proj.weight.detach().T)
    text = "The capital of France is Paris. The capital of Italy is Rome."
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert smollm2.to_str_tokens(text) == [tokenizer.decode([i]) for i in ids[0]]
    assert (
        smollm2.get_token_position(" capital", text, mode="last") == 8
    )  # The capital of France is Paris . The capital
    with torch.no_grad():
        expected = hf(ids, labels=ids).loss
        loss = smollm2.loss(text)
    assert abs(float(loss) - float(expected)) < 1e-4


def test_permanent_hooks_equal_transformers_forward_hooks(pair):
    """A permanent hook adding a vector to layer 0's output equals a forward hook doing the
    same on transformers' layer 0, in a run and through greedy generation, until reset."""
    model, hf = pair
    ids = model.tokenize(TEXT).ids
    steer = torch.linspace(-2, 2, model.config.hidden_size)
    layers = hf.base_model.h if hf.config.model_type == "gpt2" else hf.base_model.layers

    def shifted(module, args, output):
        return (output[0] + steer, *output[1:]) if isinstance(output, tuple) else output + steer

    handle = layers[0].register_forward_hook(shifted)
    try:
        with torch.no_grad():
            expected = hf(ids).logits
            expected_tokens = hf.generate(ids, max_new_tokens=4, do_sample=False)[0, ids.shape[1] :].tolist()
    finally:
        handle.remove()
    plain = model.run(ids, return_weights=False).logits
    model.add_hook(model.hook_name("resid_post", 0), lambda x: x + steer)
    try:
        assert (model.run(ids, return_weights=False).logits - expected).abs().max() < 1e-4
        assert list(model.generate_ids(ids, max_new_tokens=4)) == expected_tokens
    finally:
        model.reset_hooks()
    assert torch.equal(model.run(ids, return_weights=False).logits, plain)


def test_run_with_cache_of_a_padded_batch_equals_each_text_alone(tiny_family_folder):
    model = models.load(tiny_family_folder("qwen2"))
    texts = ["w3 w17 w5", "w8 w61 w23 w70 w1 w5 w99"]
    ids, mask = model.to_tokens(texts, padding_side="left")
    logits, cache = model.run_with_cache(ids, attention_mask=mask, names_filter=None)
    for row, text in enumerate(texts):
        alone_logits, alone = model.run_with_cache(text)
        n = alone_logits.shape[1]
        assert (logits[row, -n:] - alone_logits[0]).abs().max() < 1e-5
        for name in ("resid_post", "z"):
            padded = cache[name, 1][row]
            own = padded[-n:] if name == "resid_post" else padded[:, -n:]
            assert (own - alone[name, 1][0]).abs().max() < 1e-5, name
    with pytest.raises(ValueError, match="attention_mask goes with ids"):
        model.run_with_cache(texts, attention_mask=mask)


@pytest.mark.slow
def test_generate_stream_yields_each_tokens_text_as_decoded(smollm2):
    prompt = "The capital of France is"
    pieces = list(smollm2.generate_stream(prompt, max_new_tokens=8))
    ids = list(smollm2.generate_ids(prompt, max_new_tokens=8))
    assert [i for piece in pieces for i in piece.ids] == ids
    assert "".join(piece.text for piece in pieces) == "".join(smollm2.generate(prompt, max_new_tokens=8))
    assert all(len(piece.ids) == 1 for piece in pieces)  # plain ASCII: one token, one piece
    korean = list(smollm2.generate_stream("어제 밤에 배가", max_new_tokens=6))
    assert "".join(p.text for p in korean) == smollm2.tokenizer.decode([i for p in korean for i in p.ids])
    with pytest.raises(ValueError, match="max_new_tokens"):
        smollm2.generate_stream(prompt, max_new_tokens=-1)
