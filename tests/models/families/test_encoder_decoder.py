"""T5 (v1.0 and the gated v1.1) and BART on attnkit's modules against transformers eager,
on tiny random checkpoints that transformers writes itself: logits, the encoder, decoder
and cross-attention weights of every layer, greedy tokens with the KV cache, and the
runs, generation and errors of :class:`attnkit.models.Model` for encoder–decoders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnkit import models
from tests.fixtures.encoder_decoder_checkpoints import write_bart, write_t5

transformers = pytest.importorskip("transformers")

KINDS = ["t5", "t5-gated", "bart"]
SOURCE = "the big dog ran to the red house"
TARGET = "a cat sat on the mat"


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("encoder_decoder")
    return {
        "t5": write_t5(root / "t5"),
        "t5-gated": write_t5(root / "t5-gated", gated=True, seed=1),
        "bart": write_bart(root / "bart", scale_embedding=True),
    }


@pytest.fixture(scope="module")
def pairs(folders: dict[str, Path]) -> dict[str, tuple[models.Model, object]]:
    """attnkit's model and transformers' eager model on each folder."""
    auto = transformers.AutoModelForSeq2SeqLM
    return {
        kind: (models.load(folder), auto.from_pretrained(folder, attn_implementation="eager").eval())
        for kind, folder in folders.items()
    }


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("kind", KINDS)
def test_logits_and_every_layers_attention_equal_transformers(pairs, kind: str) -> None:
    model, hf = pairs[kind]
    source = model.tokenize(SOURCE).ids  # [1, s_src]
    start = model.module.decoder_start_token_id
    target = torch.cat((torch.tensor([[start]]), model.tokenize(TARGET).ids), dim=1)  # [1, s_tgt]
    with torch.no_grad():
        want = hf(input_ids=source, decoder_input_ids=target, output_attentions=True)
        got = model.module(source, target, return_weights=True)
    assert relative_error(got.logits, want.logits) < 1e-4
    assert len(got.encoder_weights) == len(want.encoder_attentions) == 2
    assert len(got.decoder_weights) == len(want.decoder_attentions) == 3
    for mine, theirs in zip(got.encoder_weights, want.encoder_attentions):
        torch.testing.assert_close(mine.self_attention, theirs, rtol=0, atol=1e-5)
    for mine, theirs, cross in zip(got.decoder_weights, want.decoder_attentions, want.cross_attentions):
        torch.testing.assert_close(mine.self_attention, theirs, rtol=0, atol=1e-5)
        torch.testing.assert_close(mine.cross_attention, cross, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_padded_sources_equal_transformers_with_its_attention_mask(pairs, kind: str) -> None:
    model, hf = pairs[kind]
    long, short = model.tokenize(SOURCE).ids[0], model.tokenize("a cat sat").ids[0]
    source = torch.full((2, len(long)), 1 if kind == "bart" else 0)  # the padding id
    source[0], source[1, : len(short)] = long, short
    mask = torch.zeros(2, len(long), dtype=torch.bool)
    mask[0], mask[1, : len(short)] = True, True
    target = torch.tensor([[model.module.decoder_start_token_id, 5, 9, 4]] * 2)
    with torch.no_grad():
        want = hf(input_ids=source, attention_mask=mask.long(), decoder_input_ids=target).logits
        got = model.module(source, target, source_mask=mask)
    assert relative_error(got, want) < 1e-4


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tokens_with_the_cache_equal_transformers(pairs, kind: str) -> None:
    """8 greedy steps: the encoder once and the decoder against its KV cache, compared with
    transformers recomputing everything at every step; the logits of every step too."""
    model, hf = pairs[kind]
    source = model.tokenize(SOURCE).ids
    module = model.module
    memory = module.encode(source)
    cache = module.new_kv_cache()
    step = torch.tensor([[module.decoder_start_token_id]])
    decoder_input, produced = step, []
    with torch.no_grad():
        for _ in range(8):
            logits = module.head(module.decode(step, memory, kv_cache=cache))[:, -1]  # [1, v]
            want = hf(input_ids=source, decoder_input_ids=decoder_input).logits[:, -1]
            assert relative_error(logits, want) < 1e-4
            assert int(logits.argmax()) == int(want.argmax())
            step = logits.argmax(-1, keepdim=True)
            produced.append(int(step))
            decoder_input = torch.cat((decoder_input, step), dim=1)
    assert [int(t) for t in module.stream(source, 8)] == produced


@pytest.mark.parametrize("kind", KINDS)
def test_a_tied_checkpoint_loads_one_token_matrix_for_both_embeddings_and_the_head(pairs, kind: str) -> None:
    module = pairs[kind][0].module
    assert module.head.proj.weight is module.token_embedding.weight
    assert module.target_embedding.token.weight is module.source_embedding.token.weight


def test_an_untied_t5_head_reads_its_own_matrix_unscaled(folders, tmp_path: Path) -> None:
    """T5 v1.1 checkpoints written by transformers 4 say tie_word_embeddings=false and
    hold their own lm_head; the head then reads the decoder output unscaled."""
    folder = tmp_path / "untied"
    folder.mkdir()
    config = json.loads((folders["t5-gated"] / "config.json").read_text())
    config.pop("scale_decoder_outputs", None)
    (folder / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": False}))
    tensors = load_file(folders["t5-gated"] / "model.safetensors")
    head = torch.randn_like(tensors["shared.weight"])
    save_file(tensors | {"lm_head.weight": head}, folder / "model.safetensors")
    (folder / "tokenizer.json").write_text((folders["t5-gated"] / "tokenizer.json").read_text())
    model = models.load(folder)
    source, target = model.tokenize(SOURCE).ids, torch.tensor([[0, 5, 6]])
    with torch.no_grad():
        hidden = model.module.decode(target, model.module.encode(source))
        torch.testing.assert_close(model.module(source, target), hidden @ head.T)
    assert model.module.head.weight is not model.module.token_embedding.weight


@pytest.mark.parametrize("kind", KINDS)
def test_run_encoder_decoder_gives_the_three_kinds_of_attention(pairs, kind: str) -> None:
    model, hf = pairs[kind]
    run = model.run_encoder_decoder(SOURCE, TARGET, heads=[1, 3])
    s_src, s_tgt = len(model.tokenize(SOURCE)), len(model.tokenize(TARGET))
    assert not run.generated and run.target_text == TARGET
    assert run.target_tokens == model.tokenize(TARGET).tokens
    assert run.decoder_input_tokens[1:] == run.target_tokens[:-1]
    assert sorted(run.encoder_attentions) == [0, 1] and sorted(run.cross_attentions) == [0, 1, 2]
    assert run.encoder_attentions[-1].shape == (1, 2, s_src, s_src)
    assert run.decoder_attentions[-1].shape == (1, 2, s_tgt, s_tgt)
    assert run.cross_attentions[-1].shape == (1, 2, s_tgt, s_src)
    assert run.tokens("cross") == (run.target_tokens, run.source_tokens)
    start = torch.tensor([[model.module.decoder_start_token_id]])
    with torch.no_grad():
        want = hf(
            input_ids=run.source_ids,
            decoder_input_ids=torch.cat((start, run.target_ids[:, :-1]), dim=1),
            output_attentions=True,
        )
    torch.testing.assert_close(run.cross_attentions[2], want.cross_attentions[2][:, [1, 3]], rtol=0, atol=1e-5)
    torch.testing.assert_close(run.logits, want.logits, rtol=1e-4, atol=1e-4)
    # A run over one text is the encoder's.
    single = model.run(SOURCE, return_weights=[0])
    torch.testing.assert_close(single.attentions[0], want.encoder_attentions[0], rtol=0, atol=1e-5)
    assert single.logits is None


@pytest.mark.parametrize("kind", KINDS)
def test_without_a_target_the_model_generates_it(pairs, kind: str) -> None:
    model, _ = pairs[kind]
    run = model.run_encoder_decoder(SOURCE, max_new_tokens=6, decoder_layers=[-1], encoder_layers=False)
    produced = [int(t) for t in model.module.stream(model.tokenize(SOURCE).ids, 6)]
    eos = model.tokenizer.eos_token_ids
    expected = produced[: next((i + 1 for i, t in enumerate(produced) if t in eos), 6)]
    assert run.generated and run.target_ids[0].tolist() == expected
    assert list(run.encoder_attentions) == [] and list(run.cross_attentions) == [2]
    # What the model attended to while producing each token is the teacher-forced map.
    assert run.logits[0].argmax(-1).tolist() == expected
    assert list(model.generate_ids(SOURCE, max_new_tokens=6)) == [t for t in expected if t not in eos]


def test_depths_and_features_the_config_gets_wrong_are_named(folders, tmp_path: Path) -> None:
    config = json.loads((folders["t5"] / "config.json").read_text())
    for field, value, message in [
        ("num_decoder_layers", 2, "num_decoder_layers is 2, but the weights hold 3 layers"),
        ("feed_forward_proj", "gated-swish", "feed_forward_proj='gated-swish' is not supported"),
    ]:
        folder = tmp_path / field
        folder.mkdir()
        for name in ("model.safetensors", "tokenizer.json"):
            (folder / name).write_bytes((folders["t5"] / name).read_bytes())
        (folder / "config.json").write_text(json.dumps(config | {field: value}))
        with pytest.raises(models.CheckpointError, match=message) as caught:
            models.load(folder)
        assert caught.value.field == field


def test_run_encoder_decoder_refuses_a_model_with_one_text(tmp_path: Path) -> None:
    from tests.fixtures.crafted import write_tiny_llama

    model = models.load(write_tiny_llama(tmp_path / "llama"))
    assert not model.encoder_decoder
    with pytest.raises(ValueError, match="not an encoder-decoder"):
        model.run_encoder_decoder("the cat", "a b")


HF_CROSS = {"t5": "decoder.block.{}.layer.1.EncDecAttention", "bart": "model.decoder.layers.{}.encoder_attn"}


@pytest.mark.parametrize("kind", KINDS)
def test_hooks_on_cross_attention_equal_transformers_forward_hooks(pairs, kind: str) -> None:
    """Scaling layer 1's cross-attention output through attnkit's hook point and through a
    forward hook on transformers' cross-attention module (by 4) changes the logits alike, and the
    cached pattern is transformers' cross-attention."""
    model, hf = pairs[kind]
    source = model.tokenize(SOURCE).ids
    target = torch.cat((torch.tensor([[model.module.decoder_start_token_id]]), model.tokenize(TARGET).ids), dim=1)

    def scale(module, args, output):
        return (output[0] * 4.0, *output[1:])

    hf_module = hf.get_submodule(HF_CROSS[kind.split("-")[0]].format(1))
    handle = hf_module.register_forward_hook(scale)
    try:
        with torch.no_grad():
            want = hf(input_ids=source, decoder_input_ids=target, output_attentions=True)
    finally:
        handle.remove()
    names = ["decoder.layers.2.cross_attn.pattern"]
    with torch.no_grad(), model.hooks({"decoder.layers.1.cross_attn_out": lambda x: x * 4.0}):
        got, cache = model.module.run_with_cache(source, target, names_filter=names)
        unhooked = hf(input_ids=source, decoder_input_ids=target).logits
    assert relative_error(got, want.logits) < 1e-4
    assert relative_error(got, unhooked) > 1e-3  # the hook changed something
    torch.testing.assert_close(cache[names[0]], want.cross_attentions[2], rtol=0, atol=1e-5)
