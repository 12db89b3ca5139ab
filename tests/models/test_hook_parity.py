"""Hooks against transformers' own forward hooks on the same weights: a hook that changes an
activation gives the same logits in ``run`` and ``run_batch`` and the same greedy tokens in
``generate``; identity hooks change nothing, bit for bit; every name is hit once per
forward. Tiny random checkpoints written with transformers' ``save_pretrained`` (fast), and
the real SmolLM2 and MiniLM."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.fixtures.crafted import tokenizer_json

transformers = pytest.importorskip("transformers")

LOGITS_ATOL = 1e-4
WORDS = ["<eos>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "[UNK]"]


def _steer(x: torch.Tensor) -> torch.Tensor:
    """A position-wise change of a residual stream: the same at every position, so that
    padding and KV caching cannot change what it does."""
    return -x + 0.05


def _replace_output(steer):
    """A transformers forward hook applying ``steer`` to a module's output (or to the first
    element of a tuple output)."""

    def hook(_module, _inputs, output):
        if isinstance(output, tuple):
            return (steer(output[0]), *output[1:])
        return steer(output)

    return hook


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """``(attnkit model, transformers model)`` of a tiny random LLaMA written with
    ``save_pretrained``: 3 layers, GQA."""
    from attnkit import models

    folder = tmp_path_factory.mktemp("tiny-llama")
    config = transformers.LlamaConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        eos_token_id=None,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config).eval()
    reference.save_pretrained(folder)
    Path(folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(WORDS)))
    return models.load(folder), reference


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """``(attnkit model, transformers model)`` of a tiny random BERT written with
    ``save_pretrained``."""
    from attnkit import models

    folder = tmp_path_factory.mktemp("tiny-bert")
    config = transformers.BertConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    reference = transformers.BertModel(config, add_pooling_layer=False).eval()
    reference.save_pretrained(folder)
    Path(folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(WORDS)))
    return models.load(folder), reference


def _hf_logits(reference, ids: torch.Tensor, module, hook) -> torch.Tensor:
    handle = module.register_forward_hook(hook)
    try:
        with torch.no_grad():
            return reference(ids).logits
    finally:
        handle.remove()


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ("decoder.layers.1.resid_post", lambda m: m.model.layers[1]),
        ("decoder.layers.0.attn_out", lambda m: m.model.layers[0].self_attn),
        ("decoder.layers.2.mlp_out", lambda m: m.model.layers[2].mlp),
        ("embed", lambda m: m.model.embed_tokens),
    ],
)
def test_a_changing_hook_matches_transformers_in_run_and_padded_batches(tiny_llama, ours, theirs):
    model, reference = tiny_llama
    texts = ["the cat sat on the mat", "a dog ran", "the dog"]
    with model.hooks({ours: lambda x: _steer(x)}):
        runs = [model.run(text, return_weights=False) for text in texts]
        batch = model.run_batch(texts, return_weights=False)
    plain = model.run(texts[0], return_weights=False)
    for text, run, batched in zip(texts, runs, batch):
        expected = _hf_logits(reference, model.tokenize(text).ids, theirs(reference), _replace_output(_steer))
        assert (run.logits - expected).abs().max() < LOGITS_ATOL, text
        assert (batched.logits - expected).abs().max() < LOGITS_ATOL, text
    assert (runs[0].logits - plain.logits).abs().max() > 1e-2  # the hook did change something


def test_a_changing_hook_steers_greedy_generation_as_in_transformers(tiny_llama):
    model, reference = tiny_llama
    prompt = model.tokenize("the cat").ids
    handle = reference.model.layers[1].register_forward_hook(_replace_output(_steer))
    try:
        with torch.no_grad():
            expected = reference.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    finally:
        handle.remove()
    with torch.no_grad():
        unsteered = reference.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    with model.hooks({"decoder.layers.1.resid_post": _steer}):
        steps = model.generate_ids(prompt, max_new_tokens=12)
    # Consumed after the block: the hooks of the call act on every step.
    ours = list(steps)
    assert ours == expected[0, prompt.shape[1] :].tolist()
    assert ours != unsteered[0, prompt.shape[1] :].tolist()


def test_a_changing_hook_matches_transformers_on_bert(tiny_bert):
    model, reference = tiny_bert
    ids = model.tokenize("the cat sat on the mat").ids
    for ours, theirs in (
        ("encoder.layers.0.resid_post", reference.encoder.layer[0]),
        ("encoder.layers.1.attn_out", reference.encoder.layer[1].attention.output.dense),
        ("encoder.layers.0.mlp_out", reference.encoder.layer[0].output.dense),
        ("embed", reference.embeddings),
    ):
        handle = theirs.register_forward_hook(_replace_output(_steer))
        try:
            with torch.no_grad():
                expected = reference(ids).last_hidden_state
        finally:
            handle.remove()
        with model.hooks({ours: _steer}):
            run = model.run(ids, return_weights=False)
        assert (run.last_hidden_state - expected).abs().max() < LOGITS_ATOL, ours


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_bert"])
def test_identity_hooks_on_every_name_leave_results_identical(which, request):
    model, _ = request.getfixturevalue(which)
    text = "the cat sat on the mat"
    plain = model.run(text, return_weights=False)
    plain_batch = model.run_batch([text, "a dog"], return_weights=False)
    with_weights = model.run(text)
    every = {name: (lambda x, hook: x) for name in model.hook_names()}
    reading = {name: (lambda x: None) for name in model.hook_names()}
    for hooks in (every, reading):
        with model.hooks(hooks):
            hooked = model.run(text, return_weights=False)
            hooked_batch = model.run_batch([text, "a dog"], return_weights=False)
            hooked_weights = model.run(text)
        for a, b in ((plain, hooked), *zip(plain_batch, hooked_batch), (with_weights, hooked_weights)):
            assert torch.equal(a.last_hidden_state, b.last_hidden_state)
            assert a.logits is None or torch.equal(a.logits, b.logits)
        assert all(
            torch.equal(with_weights.attentions[i], hooked_weights.attentions[i]) for i in range(model.num_layers)
        )


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_bert"])
def test_every_name_is_hit_once_per_forward(which, request):
    model, _ = request.getfixturevalue(which)
    calls: Counter[str] = Counter()
    names = model.hook_names()
    with model.hooks({name: (lambda x, hook: calls.update([hook.name])) for name in names}):
        model.run("the cat sat", return_weights=False)
    assert calls == Counter(names)
    layers = {int(name.split(".")[2]) for name in names if ".layers." in name}
    assert layers == set(range(model.num_layers))


def test_every_name_is_hit_once_per_decoding_step(tiny_llama):
    model, _ = tiny_llama
    calls: Counter[str] = Counter()
    shapes: dict[str, list[tuple[int, ...]]] = {}

    def count(x, hook):
        calls.update([hook.name])
        shapes.setdefault(hook.name, []).append(tuple(x.shape))

    names = model.hook_names()
    with model.hooks({name: count for name in names}):
        tokens = list(model.generate_ids("the cat sat", max_new_tokens=4))
    assert len(tokens) == 4
    # The prompt's forward, then one per new token but the last (which is only picked).
    assert calls == Counter({name: 4 for name in names})
    assert shapes["decoder.layers.0.self_attn.q"] == [(1, 4, 3, 8), (1, 4, 1, 8), (1, 4, 1, 8), (1, 4, 1, 8)]
    assert shapes["decoder.layers.0.self_attn.pattern"] == [(1, 4, 3, 3), (1, 4, 1, 4), (1, 4, 1, 5), (1, 4, 1, 6)]


def test_hook_sees_its_name_and_layer(tiny_llama):
    model, _ = tiny_llama
    seen = []
    with model.hooks({"decoder.layers.2.ff.post": lambda x, hook: seen.append((hook.name, hook.layer))}):
        model.run("the cat", return_weights=False)
    assert seen == [("decoder.layers.2.ff.post", 2)]


def test_run_batch_caches_each_row_without_padding(tiny_llama):
    model, _ = tiny_llama
    texts = ["the cat sat on the mat", "a dog"]
    names = ["decoder.layers.1.self_attn.pattern", "decoder.layers.1.resid_post", "decoder.layers.1.self_attn.q"]
    batch = model.run_batch(texts, return_weights=False, names_filter=names)
    for text, batched in zip(texts, batch):
        single = model.run(text, return_weights=False, names_filter=names)
        for name in names:
            assert batched.cache[name].shape == single.cache[name].shape, name
            assert (batched.cache[name] - single.cache[name]).abs().max() < 1e-5, name


@pytest.mark.slow
def test_smollm2_steered_run_and_generation_match_transformers(smollm2, hf_smollm2_sdpa, hf_smollm2):
    _, tokenizer = hf_smollm2
    reference = hf_smollm2_sdpa
    text = "The capital of France is"
    ids = tokenizer(text, return_tensors="pt").input_ids
    layer = reference.model.layers[20]
    expected = _hf_logits(reference, ids, layer, _replace_output(lambda x: -x))
    with smollm2.hooks({"decoder.layers.20.resid_post": lambda x: -x}):
        run = smollm2.run(text, return_weights=False)
        batched = smollm2.run_batch([text, "Hello"], return_weights=False)[0]
        steps = smollm2.generate_ids(text, max_new_tokens=6)
    assert (run.logits - expected).abs().max() < LOGITS_ATOL
    assert (batched.logits - expected).abs().max() < LOGITS_ATOL
    handle = layer.register_forward_hook(_replace_output(lambda x: -x))
    try:
        with torch.no_grad():
            tokens = reference.generate(ids, max_new_tokens=6, do_sample=False)[0, ids.shape[1] :].tolist()
    finally:
        handle.remove()
    eos = set(smollm2.tokenizer.eos_token_ids)
    expected_tokens = tokens[: next((i for i, t in enumerate(tokens) if t in eos), len(tokens))]
    assert list(steps) == expected_tokens


@pytest.mark.slow
def test_ablating_attention_changes_run_and_run_batch_alike(smollm2):
    text = "The capital of France is"
    plain = smollm2.run(text, return_weights=False)
    with smollm2.hooks({"decoder.layers.3.attn_out": lambda x: x * 0}):
        run = smollm2.run(text, return_weights=False)
        batched = smollm2.run_batch([text], return_weights=False)[0]
    assert (run.logits - plain.logits).abs().max() > 1.0
    assert (batched.logits - run.logits).abs().max() < LOGITS_ATOL


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batches_match_transformers_with_a_changing_hook(tiny_llama, side):
    model, reference = tiny_llama
    texts = ["the cat sat on the mat", "a dog", "the dog ran"]
    ids, mask = model.to_tokens(texts, padding_side=side)
    assert ids.shape == (3, 6) and mask.sum(1).tolist() == [6, 2, 3]
    with model.hooks({"decoder.layers.1.resid_post": _steer}):
        batch = model.run_batch(texts, return_weights=[1], padding_side=side)
        hooked = model.run_with_hooks(ids, attention_mask=mask)
    for row, (text, run) in enumerate(zip(texts, batch)):
        expected = _hf_logits(
            reference, model.tokenize(text).ids, reference.model.layers[1], _replace_output(_steer)
        )  # the row alone, unpadded
        assert (run.logits - expected).abs().max() < LOGITS_ATOL, text
        assert (hooked.logits[row, mask[row]] - expected[0]).abs().max() < LOGITS_ATOL, text
        alone = model.run(text, return_weights=[1])
        assert (run.attentions[1] - alone.attentions[1]).abs().max() < 1e-5


def test_run_with_cache_and_the_weights_per_head(tiny_llama):
    model, _ = tiny_llama
    logits, cache = model.run_with_cache("the cat sat on the mat")
    assert logits.shape == (1, 6, len(WORDS)) and len(cache) == len(model.hook_names())
    layer = model.module.decoder.layers[1]
    normed = layer.self_attn_norm(cache["resid_pre", 1])  # [1, s, e]
    w_v, w_o = model.W_V[1], model.W_O[1]  # [h_kv, e, d], [h, d, e]
    assert model.W_Q.shape == (3, 4, 32, 8) and model.W_K.shape == (3, 2, 32, 8) and w_o.shape == (4, 8, 32)
    assert torch.allclose(cache["v", 1][0, 1], normed[0] @ w_v[1], atol=1e-5)
    assert torch.allclose(cache["result", 1][0, 3], cache["z", 1][0, 3] @ w_o[3], atol=1e-5)
    assert torch.allclose(cache["decoder.final"] @ model.W_U, logits, atol=1e-5)
    batch_logits, batch_cache = model.run_with_cache(["the cat", "a dog ran"], names_filter=["decoder.final"])
    assert batch_logits.shape == (2, 3, len(WORDS)) and list(batch_cache) == ["decoder.final"]
    assert model.to_single_token("cat") == WORDS.index("cat")
    with pytest.raises(ValueError, match="must be a single token"):
        model.to_single_token("the cat")


def test_cache_helpers_decompose_the_residual_stream(tiny_llama):
    model, _ = tiny_llama
    logits, cache = model.run_with_cache("the cat sat on the mat")
    decomposed, labels = cache.decompose_resid()
    assert labels[:3] == ["embed", "0_attn_out", "0_mlp_out"] and decomposed.shape == (7, 1, 6, 32)
    accumulated, names = cache.accumulated_resid()
    assert names == ["0_pre", "1_pre", "2_pre", "final_post"]
    assert torch.allclose(decomposed.sum(0), accumulated[-1], atol=1e-5)
    assert torch.allclose(cache.decompose_resid(layer=2)[0].sum(0), cache["resid_pre", 2], atol=1e-5)
    # The logit lens of the last entry is the model's own final hidden state and logits.
    lens = cache.apply_ln_to_stack(accumulated, recompute=True)
    assert torch.allclose(lens[-1], cache["decoder.final"], atol=1e-5)
    # Direct logit attribution: the parts' contributions sum to the logit (RMSNorm, no bias).
    token = WORDS.index("mat")
    attrs = cache.logit_attrs(cache.apply_ln_to_stack(decomposed), token)  # [k, 1, s]
    assert torch.allclose(attrs.sum(0), logits[..., token], atol=1e-4)
    difference = cache.logit_attrs(cache.apply_ln_to_stack(decomposed), token, WORDS.index("cat")).sum(0)
    assert torch.allclose(difference, logits[..., token] - logits[..., WORDS.index("cat")], atol=1e-4)
    heads, head_labels = cache.stack_head_results()
    assert heads.shape == (12, 1, 6, 32) and head_labels[4] == "L1H0"
    assert torch.allclose(heads[4:8].sum(0), cache["attn_out", 1], atol=1e-5)
