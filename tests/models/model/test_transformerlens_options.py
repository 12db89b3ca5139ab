"""TransformerLens' options on attnkit's runs: ``prepend_bos`` wherever a text is
tokenized (checked against the same runs on ids that start with the BOS), layer ranges and
return kinds (against a plain pass and its cache), the cache's ``pos_slice``, and
``generate`` with the prompt, with ``prepend_bos`` and without the KV cache."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from attnkit import models
from attnkit.inspect import detectors, interventions

pytest.importorskip("transformers")

TEXT = "w3 w17 w5 w99 w42 w8 w61 w23"
CORRUPT = "w3 w17 w6 w99 w42 w8 w61 w23"
BOS = "w0"


def _tokenizer_json(adds_bos: bool) -> str:
    from tokenizers import Tokenizer, pre_tokenizers, processors
    from tokenizers import models as token_models

    words = [f"w{i}" for i in range(127)] + ["[UNK]"]
    backend = Tokenizer(token_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if adds_bos:
        backend.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 0)])
    return backend.to_str()


def _with_bos_token(source, folder, *, adds_bos: bool):
    shutil.copytree(source, folder)
    (folder / "tokenizer.json").write_text(_tokenizer_json(adds_bos))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": BOS}))
    return models.load(folder)


@pytest.fixture(scope="module")
def plain(tiny_family_folder, tmp_path_factory):
    """A tiny qwen2 whose tokenizer adds nothing, with a BOS token named (as SmolLM2's)."""
    return _with_bos_token(tiny_family_folder("qwen2"), tmp_path_factory.mktemp("bos") / "plain", adds_bos=False)


@pytest.fixture(scope="module")
def adds_bos(tiny_family_folder, tmp_path_factory):
    """The same weights, a tokenizer that puts the BOS first (as Gemma's)."""
    return _with_bos_token(tiny_family_folder("qwen2"), tmp_path_factory.mktemp("bos") / "adds", adds_bos=True)


def _ids_with_bos(model, text=TEXT):
    return torch.cat([torch.tensor([[0]]), model.to_tokens(text, prepend_bos=False)[0]], dim=1)  # [1, 1 + s]


def test_prepend_bos_in_tokens(plain, adds_bos):
    ids = plain.to_tokens(TEXT, return_mask=False)
    assert ids[0, 0] != 0 and torch.equal(
        plain.to_tokens(TEXT, prepend_bos=True, return_mask=False), _ids_with_bos(plain)
    )
    assert torch.equal(adds_bos.to_tokens(TEXT)[0], _ids_with_bos(plain))  # the tokenizer's own behaviour
    assert torch.equal(adds_bos.to_tokens(TEXT, prepend_bos=True)[0], _ids_with_bos(plain))  # never twice
    assert torch.equal(adds_bos.to_tokens(TEXT, prepend_bos=False)[0], ids)
    assert plain.to_str_tokens(TEXT, prepend_bos=True)[0] == BOS
    assert plain.get_token_position("w17", TEXT, prepend_bos=True) == plain.get_token_position("w17", TEXT) + 1 == 2
    assert adds_bos.get_token_position("w17", TEXT, prepend_bos=False) == 1
    ids_batch, mask = plain.to_tokens(["w3 w4", "w5"], prepend_bos=True)
    assert ids_batch[:, 0].tolist() == [0, 0] and mask.sum().item() == 5


def test_prepend_bos_in_runs_equals_the_ids_with_bos(plain):
    with_bos = _ids_with_bos(plain)
    run = plain.run(TEXT, prepend_bos=True)
    assert torch.equal(run.ids, with_bos) and run.tokens[0] == BOS
    assert torch.equal(run.logits, plain.run(with_bos).logits)
    logits, cache = plain.run_with_cache(TEXT, prepend_bos=True)
    reference_logits, reference = plain.run_with_cache(with_bos)
    assert torch.equal(logits, reference_logits) and torch.equal(cache["pattern", 1], reference["pattern", 1])
    assert torch.equal(plain.loss(TEXT, prepend_bos=True), plain.loss(with_bos))
    batch = plain.run_batch([TEXT, "w1 w2"], prepend_bos=True)
    assert batch[0].ids[0, 0] == 0 and batch[1].ids.tolist() == [[0, 1, 2]]


def test_prepend_bos_in_analyses_equals_the_ids_with_bos(plain):
    with_bos = _ids_with_bos(plain)
    ablation = interventions.head_ablation(plain, TEXT, target="w7", prepend_bos=True)
    by_ids = interventions.head_ablation(plain, with_bos, target="w7")
    assert torch.equal(ablation.effects, by_ids.effects) and ablation.tokens[0] == BOS
    assert not torch.equal(ablation.effects, interventions.head_ablation(plain, TEXT, target="w7").effects)
    patching = interventions.activation_patching(
        plain, TEXT, CORRUPT, by="layer-position", component="resid_pre", target="w7", wrong="w9", prepend_bos=True
    )
    patching_ids = interventions.activation_patching(
        plain,
        with_bos,
        _ids_with_bos(plain, CORRUPT),
        by="layer-position",
        component="resid_pre",
        target="w7",
        wrong="w9",
    )
    assert torch.equal(patching.effects, patching_ids.effects) and patching.effects.shape[1] == with_bos.shape[1]
    assert patching_ids.columns[0] == BOS and patching_ids.texts["clean"].startswith(BOS)
    detection = detectors.detect_heads(plain, TEXT, "previous-token", prepend_bos=True)
    assert torch.equal(detection.scores, detectors.detect_heads(plain, with_bos, "previous-token").scores)


def test_prepend_bos_in_generate_equals_the_ids_with_bos(plain):
    with_bos = _ids_with_bos(plain)
    prompt_lengths = []
    with plain.hooks({plain.hook_name("resid_pre", 0): lambda x: prompt_lengths.append(x.shape[1])}):
        generated = list(plain.generate_ids(TEXT, max_new_tokens=4, prepend_bos=True))
    assert prompt_lengths[0] == with_bos.shape[1] == plain.to_tokens(TEXT, return_mask=False).shape[1] + 1
    assert generated == list(plain.generate_ids(with_bos, max_new_tokens=4))
    streamed = plain.generate_stream(TEXT, max_new_tokens=4, prepend_bos=True)
    assert [i for piece in streamed for i in piece.ids] == generated
    pieces = list(plain.generate(TEXT, max_new_tokens=4, prepend_bos=True, include_prompt=True))
    assert pieces[0] == TEXT and "".join(pieces[1:]) == plain.tokenizer.decode(generated)


def test_prepend_bos_needs_a_bos_token(tiny_family_folder):
    model = models.load(tiny_family_folder("qwen2"))  # its config names no BOS
    assert model.bos_token_id is None
    with pytest.raises(ValueError, match="prepend_bos=True needs a BOS token"):
        model.to_tokens(TEXT, prepend_bos=True)
    assert torch.equal(model.to_tokens(TEXT, prepend_bos=False)[0], model.to_tokens(TEXT)[0])


@pytest.fixture(scope="module")
def model(tiny_family_folder):
    return models.load(tiny_family_folder("qwen2"))


def test_stop_at_layer_returns_the_residual_stream_there(model):
    ids = model.to_tokens(TEXT)[0]
    with torch.no_grad():
        full = model.run_with_hooks(ids, names_filter=None)
        for stop in range(model.num_layers + 1):
            expected = full.cache["resid_pre", stop] if stop < model.num_layers else full.cache["resid_post", -1]
            resid, cache = model.run_with_cache(ids, stop_at_layer=stop)
            assert torch.equal(resid, expected)
            later = [name for name in cache if f"layers.{stop}." in name or name.startswith("decoder.final")]
            assert not later  # nothing after the stop runs
        assert torch.equal(
            model.run_with_hooks(ids, stop_at_layer=-1, return_type="logits"), full.cache["resid_pre", -1]
        )


def test_start_at_layer_runs_the_rest_from_a_residual_stream(model):
    ids = model.to_tokens(TEXT)[0]
    with torch.no_grad():
        full = model.run_with_hooks(ids, names_filter=None)
        for start in range(model.num_layers):
            logits, cache = model.run_with_cache(full.cache["resid_pre", start], start_at_layer=start)
            torch.testing.assert_close(logits, full.logits, rtol=0, atol=1e-5)
            assert not any(f"layers.{start - 1}." in name for name in cache) and "embed" not in cache
        middle = model.run_with_hooks(full.cache["resid_pre", 1], start_at_layer=1, stop_at_layer=2).last_hidden_state
        torch.testing.assert_close(middle, full.cache["resid_pre", 2], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="residual stream"):
        model.run_with_hooks(ids, start_at_layer=1)
    with pytest.raises(ValueError, match="stop_at_layer must be an integer"):
        model.run_with_hooks(ids, stop_at_layer=model.num_layers + 1)


def test_return_types(model):
    ids = model.to_tokens(TEXT)[0]
    with torch.no_grad():
        run = model.run_with_hooks(ids)
        assert torch.equal(model.run_with_hooks(ids, return_type="logits"), run.logits)
        loss = model.run_with_hooks(ids, return_type="loss")
        assert torch.equal(loss, model.loss_fn(run.logits, ids)) and torch.equal(loss, model.loss(ids))
        logits, both_loss = model.run_with_hooks(ids, return_type="both")
        assert torch.equal(logits, run.logits) and torch.equal(both_loss, loss)
        assert model.run_with_hooks(ids, return_type=None) is None
        (cached_logits, cached_loss), cache = model.run_with_cache(ids, return_type="both")
        assert torch.equal(cached_loss, loss) and len(cache) > 0
    with pytest.raises(ValueError, match="return_type must be"):
        model.run_with_hooks(ids, return_type="probs")


def test_pos_slice_keeps_those_positions_along_the_query_dim(model):
    ids = model.to_tokens(TEXT)[0]
    _, full = model.run_with_cache(ids)
    for pos_slice, index in [(-1, [7]), (2, [2]), (slice(1, 4), [1, 2, 3]), ([0, 5], [0, 5])]:
        _, cache = model.run_with_cache(ids, pos_slice=pos_slice)
        assert sorted(cache) == sorted(full)
        assert torch.equal(cache["resid_pre", 1], full["resid_pre", 1][:, index])
        assert torch.equal(cache["z", 1], full["z", 1][:, :, index])
        assert torch.equal(cache["pattern", 1], full["pattern", 1][:, :, index])  # query rows, every key
        assert torch.equal(cache["blocks.1.attn.hook_z"], full["blocks.1.attn.hook_z"][:, index])


def test_generate_without_kv_cache_and_with_the_prompt(model):
    prompt = "w3 w17 w5"
    cached = list(model.generate_ids(prompt, max_new_tokens=6))
    assert list(model.generate_ids(prompt, max_new_tokens=6, use_kv_cache=False)) == cached
    pieces = list(model.generate(prompt, max_new_tokens=6, include_prompt=True))
    assert pieces[0] == prompt and "".join(pieces[1:]) == "".join(model.generate(prompt, max_new_tokens=6))
    ids = model.to_tokens(prompt)[0]
    assert next(iter(model.generate(ids, max_new_tokens=6, include_prompt=True))) == model.tokenizer.decode(ids[0])


def test_encoder_decoder_generates_with_the_prompt_and_without_kv_cache(tiny_t5):
    source = "translate this"
    cached = list(tiny_t5.generate_ids(source, max_new_tokens=5))
    assert list(tiny_t5.generate_ids(source, max_new_tokens=5, use_kv_cache=False)) == cached
    pieces = list(tiny_t5.generate(source, max_new_tokens=5, include_prompt=True))
    assert pieces[0] == source and "".join(pieces[1:]) == tiny_t5.tokenizer.decode(cached)


def test_short_names_of_points_outside_the_layers(model):
    _, cache = model.run_with_cache(model.to_tokens(TEXT)[0])
    assert torch.equal(cache["final_norm.scale"], cache[model.hook_name("final_norm.scale")])
    assert "final_norm.scale" in cache and "final" in cache
    with pytest.raises(KeyError):
        cache["no_such_point"]
