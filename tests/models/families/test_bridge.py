"""The bridge (:mod:`attnkit.models.families.bridge`): architectures attnkit has no family for, on
tiny random checkpoints written by transformers (tests.fixtures.bridge_checkpoints.py), equal
transformers' eager forward: logits, every layer's attention weights, greedy tokens, the
residual hook points against transformers' forward hooks, a head's ablation against zeroing
its slice of the output projection's input; by folder and by Hugging Face name offline. An
architecture whose attention bypasses the interface is refused in one line."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from attnkit import models
from attnkit.inspect import interventions, methods
from attnkit.models.families.bridge_attention import BridgeRefused, attnkit_attention_forward
from attnkit.models.families.table import TESTED_BRIDGES
from tests.fixtures.bridge_checkpoints import CASES, SIZES, VOCAB, write_bridge_checkpoint
from tests.inspect.test_analysis import assert_close_to_scale, hf_value_weighted

transformers = pytest.importorskip("transformers")

LENGTH = 20  # tokens: longer than the sliding windows of the tiny checkpoints
TEXT = " ".join(f"w{i}" for i in (3, 17, 5, 99, 42, 8, 61, 23, 70, 1, 9, 33))
ARCHITECTURES = sorted(CASES)
# Architectures whose transformers code fixes the batch at the embeddings: the rows that
# ablation and patching add at a layer's input are refused.
ROWS_FIXED = {"gpt_bigcode"}


@pytest.fixture(scope="module")
def bridged(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, models.Model, nn.Module]]:
    """``bridged(model_type)``: its folder, the attnkit model and transformers' model with
    eager attention, each written and loaded once."""
    root = tmp_path_factory.mktemp("bridge")
    loaded: dict[str, tuple[Path, models.Model, nn.Module]] = {}

    def get(model_type: str) -> tuple[Path, models.Model, nn.Module]:
        if model_type not in loaded:
            folder = write_bridge_checkpoint(model_type, root / model_type)
            hf = transformers.AutoModelForCausalLM.from_pretrained(
                folder, attn_implementation="eager", dtype=torch.float32
            ).eval()
            loaded[model_type] = (folder, models.load(folder), hf)
        return loaded[model_type]

    return get


def _ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, LENGTH), generator=torch.Generator().manual_seed(seed))


def _same_module(hf: nn.Module, bridged_hf: nn.Module, module: nn.Module) -> nn.Module:
    """The module of ``hf`` at the path ``module`` has in ``bridged_hf``."""
    path = next(name for name, m in bridged_hf.named_modules() if m is module)
    return hf.get_submodule(path)


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_logits_maps_and_greedy_tokens_equal_transformers(model_type, bridged) -> None:
    _, model, hf = bridged(model_type)
    assert model.family == f"bridge:{model_type}"
    ids = _ids()
    run = model.run(ids)
    with torch.no_grad():
        expected = hf(ids, output_attentions=True)
    assert (run.logits - expected.logits).abs().max() <= 1e-5 * max(1.0, float(expected.logits.abs().max()))
    assert len(expected.attentions) == model.num_layers == len(run.attentions)
    # The first layer's maps are transformers' within 1e-6; later layers read the fused
    # kernel's outputs of the earlier ones, as a pass without weights does (up to 3.4e-6
    # measured), the decoder families' tolerance.
    for i, weights in enumerate(expected.attentions):
        torch.testing.assert_close(run.attentions[i], weights, rtol=0, atol=1e-6 if i == 0 else 1e-5)
    with torch.no_grad():
        theirs = hf.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert list(model.generate_ids(ids, max_new_tokens=8)) == theirs[0, LENGTH:].tolist()
    assert list(model.generate_ids(ids, max_new_tokens=8, use_kv_cache=False)) == theirs[0, LENGTH:].tolist()


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_seeded_nucleus_samples_equal_transformers_samples(model_type, bridged) -> None:
    # The same top_k then top_p filter and torch.multinomial draws, seeded alike.
    _, model, hf = bridged(model_type)
    ours = list(model.generate_ids(_ids(), max_new_tokens=8, temperature=0.8, top_k=20, top_p=0.7, seed=2))
    torch.manual_seed(2)
    with torch.no_grad():
        theirs = hf.generate(_ids(), max_new_tokens=8, do_sample=True, temperature=0.8, top_k=20, top_p=0.7)
    assert ours == theirs[0, LENGTH:].tolist()


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_the_chosen_heads_and_rows_alone_equal_transformers_maps(model_type, bridged) -> None:
    _, model, hf = bridged(model_type)
    ids = _ids()
    heads = [model.num_heads - 1, 0]
    run = model.run(ids, return_weights=[-1], heads=heads, rows=range(3, 11))
    with torch.no_grad():
        expected = hf(ids, output_attentions=True).attentions[-1]
    assert run.attentions[-1].shape == (1, 2, 8, LENGTH)
    every_head = model.run(ids, return_weights=[-1]).attentions[-1]
    torch.testing.assert_close(run.attentions[-1], every_head[:, heads, 3:11], rtol=0, atol=1e-7)
    torch.testing.assert_close(run.attentions[-1], expected[:, heads, 3:11], rtol=0, atol=1e-5)
    assert torch.equal(run.logits, model.run(ids, return_weights=False).logits)


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_hooks_equal_transformers_forward_hooks(model_type, bridged) -> None:
    _, model, hf = bridged(model_type)
    theirs: dict[str, torch.Tensor] = {}
    handles = []
    base = hf.base_model
    for i, (points, layer) in enumerate(
        zip(model.module.decoder.layers, base.layers if hasattr(base, "layers") else base.h)
    ):
        attn = next(m for name, m in layer.named_children() if name in ("self_attn", "attn", "attention"))
        mlp = next(m for name, m in layer.named_children() if name in ("mlp", "block_sparse_moe", "feed_forward"))
        handles += [
            layer.register_forward_pre_hook(lambda m, a, i=i: theirs.__setitem__(f"resid_pre{i}", a[0])),
            attn.register_forward_hook(lambda m, a, out, i=i: theirs.__setitem__(f"attn_out{i}", out[0])),
            mlp.register_forward_hook(
                lambda m, a, out, i=i: theirs.__setitem__(f"mlp_out{i}", out[0] if isinstance(out, tuple) else out)
            ),
            layer.register_forward_hook(
                lambda m, a, out, i=i: theirs.__setitem__(f"resid_post{i}", out[0] if isinstance(out, tuple) else out)
            ),
        ]
        assert points.mlp_out is not None
    ids = _ids()
    try:
        with torch.no_grad():
            hf(ids)
    finally:
        for handle in handles:
            handle.remove()
    kinds = ("resid_pre", "attn_out", "mlp_out", "resid_post")
    names = [model.hook_name(kind, i) for i in range(model.num_layers) for kind in kinds]
    cache = model.run(ids, return_weights=False, names_filter=names).cache
    for i in range(model.num_layers):
        for kind in kinds:
            ours, expected = cache[model.hook_name(kind, i)], theirs[f"{kind}{i}"]
            assert (ours - expected).abs().max() <= 1e-5 * max(1.0, float(expected.abs().max())), (kind, i)


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_a_head_ablation_equals_zeroing_its_slice_of_the_output_projection(model_type, bridged) -> None:
    _, model, hf = bridged(model_type)
    ids = model.tokenize(TEXT).ids
    layer, head, d = model.num_layers - 1, 1, model.config.head_dim
    out_proj = _same_module(hf, model.module.hf, model.module.self_attention(layer).out_proj)

    def zero_slice(module, inputs):
        merged = inputs[0].clone()
        merged[..., head * d : (head + 1) * d] = 0
        return (merged,)

    handle = out_proj.register_forward_pre_hook(zero_slice)
    try:
        with torch.no_grad():
            expected = hf(ids).logits
    finally:
        handle.remove()

    def zero_head(z):
        z = z.clone()
        z[:, head] = 0
        return z

    with model.hooks({model.hook_name("z", layer): zero_head}):
        ablated = model.run(ids, return_weights=False).logits
    assert (ablated - expected).abs().max() <= 1e-5 * max(1.0, float(expected.abs().max()))
    plain = model.run(ids, return_weights=False).logits
    target = int(plain[0, -1].argmax())
    effect = torch.log_softmax(ablated[0, -1], -1)[target] - torch.log_softmax(plain[0, -1], -1)[target]
    target_token = model.tokenizer.id_to_token(target)
    if model_type in ROWS_FIXED:
        with pytest.raises(BridgeRefused, match="ablation and patching of this architecture are not available"):
            interventions.head_ablation(model, TEXT, target=target_token, layers=[layer])
        return
    grid = interventions.head_ablation(model, TEXT, target=target_token, layers=[layer])
    assert abs(float(grid.effects[0, head]) - float(effect)) < 1e-5


@pytest.mark.parametrize("model_type", ["cohere2", "granitemoe", "granite"])
def test_a_padded_batch_equals_each_text_alone(model_type, bridged) -> None:
    _, model, _ = bridged(model_type)
    texts = [" ".join(f"w{i}" for i in range(3, 3 + n)) for n in (LENGTH, 7, 12)]
    batch = model.run_batch(texts)
    for text, got in zip(texts, batch):
        alone = model.run(text)
        torch.testing.assert_close(got.logits, alone.logits, rtol=0, atol=1e-5)
        for i in range(model.num_layers):
            torch.testing.assert_close(got.attentions[i], alone.attentions[i], rtol=0, atol=1e-5)


def test_result_points_sum_to_the_attention_output(bridged) -> None:
    _, model, _ = bridged("olmo2")
    names = [model.hook_name("result", 0), model.hook_name("attn_out", 0)]
    cache = model.run(_ids(), return_weights=False, names_filter=names).cache
    torch.testing.assert_close(cache[names[0]].sum(1), cache[names[1]], rtol=0, atol=1e-5)


def test_what_the_bridge_cannot_offer_is_refused_by_name(bridged) -> None:
    _, model, _ = bridged("olmo2")
    with pytest.raises(BridgeRefused, match=r"q_proj \(W_Q\) and points before the rotary encoding"):
        _ = model.W_Q
    assert "self_attn.q" in model.hook_name("self_attn.q", 0)
    with pytest.raises(ValueError, match="matches no point"):
        model.hook_name("resid_mid", 0)

    def replace(k):
        return k + 1

    with model.hooks({model.hook_name("k", 0): replace}), pytest.raises(BridgeRefused, match="transformers' cache"):
        list(model.generate_ids(_ids(), max_new_tokens=3))


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_a_hugging_face_name_opens_offline(model_type, bridged, tmp_path, monkeypatch) -> None:
    folder, model, _ = bridged(model_type)
    name = f"tiny-org/tiny-{model_type.replace('_', '-')}"
    repo = tmp_path / ("models--" + name.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("c" * 40)
    shutil.copytree(folder, repo / "snapshots" / ("c" * 40))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    by_name = models.load(name)
    assert by_name.name == f"{name} (bridge:{model_type})" and by_name.family == f"bridge:{model_type}"
    ids = _ids(2)
    assert torch.equal(by_name.run(ids).logits, model.run(ids).logits)


def test_an_architecture_that_bypasses_the_interface_is_refused_in_one_line(tmp_path) -> None:
    config = transformers.AutoConfig.for_model(
        "bloom", vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4, bos_token_id=None, eos_token_id=None
    )
    folder = tmp_path / "bloom"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    with pytest.raises(models.CheckpointError) as caught:
        models.load(folder)
    message = str(caught.value)
    assert "\n" not in message and "model_type 'bloom' is not supported" in message
    assert "computes attention without transformers' attention interface" in message


def test_an_architecture_with_layers_outside_the_interface_is_refused_by_the_probe(tmp_path) -> None:
    # MiniMax alternates linear-attention layers (its own code) with softmax layers (the interface).
    config = transformers.AutoConfig.for_model("minimax", **{**SIZES, "num_key_value_heads": 2})
    folder = tmp_path / "minimax"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    (folder / "tokenizer.json").write_text(json.dumps({"unused": True}))
    with pytest.raises(models.CheckpointError) as caught:
        models.load(folder)
    message = str(caught.value)
    assert "\n" not in message and "bridge:minimax" in message
    assert "ran 1 times, not exactly once in each decoder layer" in message


def test_a_model_type_transformers_does_not_know_is_refused_naming_the_families(tmp_path) -> None:
    folder = tmp_path / "unknown"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(models.CheckpointError, match="'no-such-architecture' is not supported") as caught:
        models.load(folder)
    assert "\n" not in str(caught.value) and "llama" in str(caught.value)


def test_a_cache_computes_the_maps_the_run_returns(bridged) -> None:
    _, model, _ = bridged("cohere2")
    ids = _ids()
    run = model.run(ids)
    _, cache = model.run_with_cache(ids, names_filter=lambda name: name.endswith(("pattern", "scores")))
    for i in range(model.num_layers):
        torch.testing.assert_close(cache[model.hook_name("pattern", i)].float(), run.attentions[i], rtol=0, atol=1e-6)


def test_value_weighted_maps_equal_those_from_transformers_projections(bridged) -> None:
    _, model, hf = bridged("granite")
    ids = model.tokenize(TEXT).ids
    parts = [(layer.self_attn, layer.self_attn.v_proj, layer.self_attn.o_proj) for layer in hf.model.layers]
    per_head, summed = hf_value_weighted(hf, ids, parts, num_heads=model.num_heads)
    ours = methods.value_weighted(model, TEXT)
    for layer in range(model.num_layers):
        assert_close_to_scale(ours.heads[layer], per_head[layer], f"layer {layer} per head")
        assert_close_to_scale(ours.summed[layer], summed[layer], f"layer {layer} summed")


def test_attention_dropout_and_unknown_options_are_refused(bridged) -> None:
    _, model, _ = bridged("olmo2")
    module = model.module.self_attention(0).out_proj  # any module stands for the caller
    q = torch.zeros(1, 4, 3, 16)
    with pytest.raises(BridgeRefused, match="attention dropout 0.1"):
        attnkit_attention_forward(module, q, q, q, None, dropout=0.1, scaling=0.25)
    with pytest.raises(BridgeRefused, match="passes s_aux to its attention function"):
        attnkit_attention_forward(module, q, q, q, None, s_aux=torch.zeros(4))


def test_the_families_table_lists_the_architectures_tested_here() -> None:
    assert set(TESTED_BRIDGES) == set(CASES)
