"""Gemma 3 270M on attnkit.nn against transformers' Gemma3ForCausalLM on the same weights:
tokens, logits, every layer's and head's attention weights, the sliding window of its local
layers on a text longer than the window, greedy generation, hooks, the viewer, and the
pictures of docs/models.md."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import torch

from attnkit.cli import main
from attnkit.viz.viewer import ViewerData
from tests.models.model.test_family_hooks import _first
from tests.viz.test_viewer_html import page_parts

pytestmark = pytest.mark.slow

SENTENCES = [
    "The cat sat on the mat.",
    "The animal didn't cross the road because it was too tired.",
    "Attention is all you need: queries, keys and values — 3 matrices, one softmax!",
    "어제 밤에 배가 고파서 피자를 먹었다",
]
LOGITS_ATOL = 1e-4
WEIGHTS_ATOL = 1e-5
WINDOW = 512
# Five local layers (a sliding window of 512 tokens) then one global layer, three times.
GLOBAL_LAYERS = [5, 11, 17]
# About 600 tokens: longer than the window, short enough for a test.
LONG_TEXT = " ".join(["Queries look for keys, and the values of the keys they find are mixed into the output."] * 30)


@pytest.fixture(scope="module")
def reference(hf_gemma3):
    """Hugging Face logits and attention weights of every sentence, computed once."""
    model, tokenizer = hf_gemma3
    out = {}
    with torch.no_grad():
        for text in SENTENCES:
            ids = tokenizer(text, return_tensors="pt").input_ids
            result = model(ids, output_attentions=True)
            out[text] = (ids, result.logits, result.attentions)
    return out


def test_local_and_global_layers_are_read_from_the_config(gemma3, hf_gemma3):
    config = hf_gemma3[0].config
    assert config.sliding_window == WINDOW
    expected = [None if kind == "full_attention" else WINDOW for kind in config.layer_types]
    assert [i for i, window in enumerate(expected) if window is None] == GLOBAL_LAYERS
    assert list(gemma3.config.windows) == expected
    assert [layer.self_attn.window for layer in gemma3.module.decoder.layers] == expected
    assert (gemma3.num_layers, gemma3.num_heads, gemma3.num_kv_heads, gemma3.config.head_dim) == (18, 4, 1, 256)


@pytest.mark.parametrize("text", SENTENCES)
def test_tokens_match_transformers(gemma3, hf_gemma3, text):
    _, tokenizer = hf_gemma3
    encoded = gemma3.tokenize(text)
    expected = tokenizer(text).input_ids
    assert encoded.ids[0].tolist() == expected and expected[0] == 2  # <bos>
    assert encoded.tokens == tokenizer.convert_ids_to_tokens(expected)


@pytest.mark.parametrize("text", SENTENCES)
def test_logits_and_every_attention_map_match_transformers(gemma3, reference, text):
    ids, logits, attentions = reference[text]
    run = gemma3.run(text)
    assert torch.equal(run.ids, ids)
    assert (run.logits - logits).abs().max() < LOGITS_ATOL
    assert sorted(run.attentions) == list(range(18)) and run.heads == list(range(4))
    for layer, expected in enumerate(attentions):  # [1, 4, s, s] each
        assert run.attentions[layer].shape == expected.shape
        assert (run.attentions[layer] - expected).abs().max() < WEIGHTS_ATOL, f"layer {layer}"
    fused = gemma3.run(text, return_weights=False)
    assert fused.attentions == {} and (fused.logits - logits).abs().max() < LOGITS_ATOL


def test_local_layers_attend_only_within_the_window(gemma3, hf_gemma3):
    model, _ = hf_gemma3
    run = gemma3.run(LONG_TEXT, logits=False)
    s = run.ids.shape[1]
    assert WINDOW + 50 < s < 700
    with torch.no_grad():
        expected = model.model(run.ids, output_attentions=True).attentions
    for layer in range(18):
        assert (run.attentions[layer] - expected[layer]).abs().max() < WEIGHTS_ATOL, f"layer {layer}"
        # The weight each query gives to keys WINDOW or more tokens behind it.
        beyond = torch.stack([run.attentions[layer][0, :, q, : q - WINDOW + 1].sum(-1) for q in range(WINDOW, s)])
        if layer in GLOBAL_LAYERS:
            assert (beyond > 0).all(), f"global layer {layer} looks beyond the window"
        else:
            assert (beyond == 0).all(), f"local layer {layer} sees nothing beyond its window"


def test_greedy_generation_equals_transformers(gemma3, hf_gemma3):
    model, tokenizer = hf_gemma3
    prompt = "The capital of France is"
    encoded = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        expected = model.generate(**encoded, max_new_tokens=16, do_sample=False)[0, encoded.input_ids.shape[1] :]
    ours = list(gemma3.generate_ids(prompt, max_new_tokens=16))
    assert ours == expected.tolist()
    assert "".join(gemma3.tokenizer.stream(ours)) == tokenizer.decode(expected)
    assert tokenizer.decode(expected).startswith(" the capital of the country of France.")


def test_cached_decoding_past_the_window_equals_full_recomputation(gemma3):
    ids = gemma3.tokenize(LONG_TEXT).ids[:, : WINDOW + 8]  # [1, s]
    module = gemma3.module
    with torch.no_grad():
        full = module(ids)  # [1, s, v]
        cache = module.new_kv_cache()
        steps = [module(ids[:, :WINDOW], kv_cache=cache)]
        steps += [module(ids[:, i : i + 1], kv_cache=cache) for i in range(WINDOW, ids.shape[1])]
    assert (torch.cat(steps, dim=1)[:, WINDOW - 1 :] - full[:, WINDOW - 1 :]).abs().max() < LOGITS_ATOL


def test_hooks_equal_transformers_forward_hooks(gemma3, hf_gemma3):
    model, tokenizer = hf_gemma3
    text = SENTENCES[1]
    ids = gemma3.tokenize(text).ids
    theirs: dict[str, torch.Tensor] = {}
    handles = []
    for i, layer in enumerate(model.model.layers):
        for name, module in ((f"resid_post{i}", layer), (f"attn_out{i}", layer.post_attention_layernorm)):
            keep = lambda m, a, out, name=name: theirs.__setitem__(name, _first(out))  # noqa: E731
            handles.append(module.register_forward_hook(keep))
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for handle in handles:
            handle.remove()
    names = [gemma3.hook_name(kind, i) for i in range(18) for kind in ("resid_post", "attn_out")]
    cache = gemma3.run(ids, return_weights=False, names_filter=names).cache
    for i in range(18):
        for kind in ("resid_post", "attn_out"):
            ours, expected = cache[gemma3.hook_name(kind, i)], theirs[f"{kind}{i}"]
            assert (ours - expected).abs().max() <= 1e-5 * max(1.0, float(expected.abs().max())), (kind, i)
    # A hook that changes nothing changes nothing; one that zeroes a pattern changes the output.
    plain = gemma3.run(text, return_weights=False)
    with gemma3.hooks({name: (lambda t: t) for name in gemma3.hook_names()}):
        assert torch.equal(gemma3.run(text, return_weights=False).logits, plain.logits)

    def uniform(pattern: torch.Tensor) -> torch.Tensor:
        return pattern.tril() / pattern.tril().ne(0).sum(-1, keepdim=True)

    with gemma3.hooks({gemma3.hook_name("self_attn.pattern", 5): uniform}):
        assert not torch.equal(gemma3.run(text, return_weights=False).logits, plain.logits)


def test_the_html_viewer_carries_every_map(gemma3, tmp_path):
    text = SENTENCES[0]
    argv = ["inspect", text, "--model", "gemma3", "--format", "html", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    (page,) = tmp_path.glob("*_viewer.html")
    data = ViewerData.from_json(page_parts(page.read_text())["data"])
    section = data.sections["self"]
    assert data.kind == "causal" and data.model_name == "gemma3" and data.text == text
    expected = gemma3.run(text).attentions
    assert section.layers == tuple(range(18)) and section.heads == tuple(range(4))
    for layer in section.layers:
        for head in section.heads:
            assert (section.map(layer, head) - expected[layer][0, head]).abs().max() < 1e-5, (layer, head)


def test_the_pictures_in_the_docs_come_from_the_command_they_show(gemma3, tmp_path):
    root = Path(__file__).resolve().parents[3]
    page = (root / "docs" / "models.md").read_text()
    sentence = "Queries look for keys, and the values of the keys they find are mixed into the output."
    assert f"""TEXT=$(python -c 'print(" ".join(["{sentence}"] * 36))')""" in page
    command = (
        'attnkit inspect "$TEXT" --model gemma3 --layers 4,5 --heads 0 --format png --scale log '
        "--figsize 11,10 --dpi 64 --out docs/images"
    )
    assert command in page
    argv = [" ".join([sentence] * 36) if word == "$TEXT" else word for word in shlex.split(command)[1:]]
    assert main([*argv[:-1], str(tmp_path), "--quiet"]) == 0
    for name in ("gemma3_layer4_head0.png", "gemma3_layer5_head0.png"):
        assert (tmp_path / name).stat().st_size < 300_000
        assert f"(images/{name})" in page and (root / "docs" / "images" / name).stat().st_size < 300_000
