"""SmolLM2 on attnkit.nn against transformers' LlamaForCausalLM on the same weights:
tokens, logits, every layer's and head's attention weights, greedy generation."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow

SENTENCES = [
    "The cat sat on the mat.",
    "The animal didn't cross the road because it was too tired.",
    "Attention is all you need: queries, keys and values — 3 matrices, one softmax!",
    "어제 밤에 배가 고파서 피자를 먹었다",
]
LOGITS_ATOL = 1e-4
WEIGHTS_ATOL = 1e-5


@pytest.fixture(scope="module")
def reference(hf_smollm2):
    """Hugging Face logits and attention weights of every sentence, computed once."""
    model, tokenizer = hf_smollm2
    out = {}
    with torch.no_grad():
        for text in SENTENCES:
            ids = tokenizer(text, return_tensors="pt").input_ids
            result = model(ids, output_attentions=True)
            out[text] = (ids, result.logits, result.attentions)
    return out


@pytest.mark.parametrize("text", SENTENCES)
def test_tokens_match_transformers(smollm2, hf_smollm2, text):
    _, tokenizer = hf_smollm2
    encoded = smollm2.tokenize(text)
    expected = tokenizer(text).input_ids
    assert encoded.ids[0].tolist() == expected
    assert encoded.tokens == tokenizer.convert_ids_to_tokens(expected)
    assert len(encoded.offsets) == len(encoded.tokens)
    assert all(0 <= a <= b <= len(text) for a, b in encoded.offsets)
    assert text[slice(*encoded.offsets[0])].strip() == text.split()[0][: encoded.offsets[0][1]]


@pytest.mark.parametrize("text", SENTENCES)
def test_logits_and_every_attention_map_match_transformers(smollm2, reference, text):
    ids, logits, attentions = reference[text]
    run = smollm2.run(text)
    assert torch.equal(run.ids, ids)
    assert (run.logits - logits).abs().max() < LOGITS_ATOL
    assert sorted(run.attentions) == list(range(30)) and run.heads == list(range(9))
    for layer, expected in enumerate(attentions):  # [1, 9, s, s] each
        assert run.attentions[layer].shape == expected.shape
        assert (run.attentions[layer] - expected).abs().max() < WEIGHTS_ATOL, f"layer {layer}"


@pytest.mark.parametrize("text", SENTENCES)
def test_fused_path_without_weights_matches_transformers(smollm2, hf_smollm2_sdpa, reference, text):
    ids, logits, _ = reference[text]
    run = smollm2.run(text, return_weights=False)
    assert run.attentions == {}
    assert (run.logits - logits).abs().max() < LOGITS_ATOL
    with torch.no_grad():
        sdpa_logits = hf_smollm2_sdpa(ids).logits
    # Same kernels, same order of operations as transformers' sdpa path.
    assert (run.logits - sdpa_logits).abs().max() < 1e-5


def test_chosen_layers_and_heads_are_slices_of_the_full_maps(smollm2, reference):
    text = SENTENCES[1]
    ids, logits, attentions = reference[text]
    s = ids.shape[1]
    run = smollm2.run(text, return_weights=[-1, 3, 3], heads=[8, 0])
    assert sorted(run.attentions) == [3, 29] and run.heads == [8, 0]
    for layer in (3, 29):
        assert run.attentions[layer].shape == (1, 2, s, s) and run.attentions[layer].dtype == torch.float32
        assert (run.attentions[layer] - attentions[layer][:, [8, 0]]).abs().max() < WEIGHTS_ATOL
    assert (run.logits - logits).abs().max() < LOGITS_ATOL
    # Negative layers count from the end in the result too, as they do in return_weights=[...].
    assert run.attentions[-1] is run.attentions[29] and -1 in run.attentions and -30 not in run.attentions
    assert run.attentions.get(-27) is run.attentions[3] and run.attentions.get(-2) is None
    with pytest.raises(KeyError, match=r"layer -2 was not asked for; this run has the weights of layers \[3, 29\]"):
        run.attentions[-2]


def test_greedy_generation_of_32_tokens_equals_transformers(smollm2, hf_smollm2):
    model, tokenizer = hf_smollm2
    prompt = "Once upon a time"  # continued past 32 tokens without an end-of-sequence token
    encoded = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        expected = model.generate(**encoded, max_new_tokens=32, do_sample=False)[0, encoded.input_ids.shape[1] :]
    ours = list(smollm2.generate_ids(prompt, max_new_tokens=32))
    assert ours == expected.tolist() and len(ours) == 32
    # The streamed pieces join to the same text transformers decodes.
    assert "".join(smollm2.tokenizer.stream(ours)) == tokenizer.decode(expected)


def test_generation_stops_before_the_end_of_sequence_token(smollm2):
    # Greedy "The capital of France is" -> " Paris.\n\nThe answer is: 2018-01-22 12:12:53."
    # then <|im_end|> (id 2), which transformers would append and attnkit does not yield.
    ids = list(smollm2.generate_ids("The capital of France is", max_new_tokens=40))
    assert len(ids) == 29 and 2 not in ids
    assert smollm2.tokenizer.decode(ids).startswith(" Paris.")


def test_cached_decoding_equals_full_recomputation(smollm2):
    ids = smollm2.tokenize(SENTENCES[2]).ids  # [1, s]
    module = smollm2.module
    with torch.no_grad():
        full = module(ids)  # [1, s, v]
        cache = module.new_kv_cache()
        steps = [module(ids[:, :5], kv_cache=cache)]
        steps += [module(ids[:, i : i + 1], kv_cache=cache) for i in range(5, ids.shape[1])]
    assert len(cache) == ids.shape[1]
    assert (torch.cat(steps, dim=1) - full).abs().max() < LOGITS_ATOL


def test_generation_from_ids_and_sampling(smollm2):
    prompt = "Once upon a time"
    greedy = list(smollm2.generate_ids(prompt, max_new_tokens=4))
    assert list(smollm2.generate_ids(smollm2.tokenize(prompt).ids[0].tolist(), max_new_tokens=4)) == greedy
    first = list(smollm2.generate_ids(prompt, max_new_tokens=4, temperature=0.8, seed=7))
    again = list(smollm2.generate_ids(prompt, max_new_tokens=4, temperature=0.8, seed=7))
    assert first == again and len(first) == 4
    assert list(smollm2.generate_ids(prompt, max_new_tokens=4, temperature=1.5, top_k=1, seed=1)) == greedy
    assert list(smollm2.generate_ids(prompt, max_new_tokens=0)) == []


def test_run_from_ids_names_the_tokens(smollm2):
    run = smollm2.run(torch.tensor([504, 2644, 2643]), return_weights=[0])
    assert run.tokens == ["The", "Ġcat", "Ġsat"] and run.offsets is None
    assert run.ids.shape == (1, 3) and run.logits.shape == (1, 3, 49152) and run.last_hidden_state.shape == (1, 3, 576)


def test_input_errors(smollm2, monkeypatch):
    with pytest.raises(ValueError, match="text is empty"):
        smollm2.run("")
    with pytest.raises(ValueError, match=r"text is 9000 tokens long; smollm2 reads at most 8192 tokens"):
        smollm2.tokenize(" a" * 9000)
    with pytest.raises(ValueError, match=r"layer 30 is out of range: smollm2 has 30 layers"):
        smollm2.run("hi", return_weights=[30])
    with pytest.raises(ValueError, match=r"head -10 is out of range: smollm2 has 9 heads"):
        smollm2.run("hi", heads=[-10])
    with pytest.raises(ValueError, match="no heads selected"):
        smollm2.run("hi", heads=[])
    with pytest.raises(TypeError, match="layer indices must be ints"):
        smollm2.run("hi", return_weights=[1.5])
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 49152\)"):
        smollm2.run([49152])
    with pytest.raises(TypeError, match="token ids must be integers"):
        smollm2.run(torch.zeros(3))
    with pytest.raises(ValueError, match=r"rows 0..4 are out of range: the input has 1 tokens"):
        smollm2.run("hi", rows=range(5))
    # Every head of every layer on 5000 tokens: 25.1 GiB of maps, refused by the memory
    # free (here capped), not by a fixed cap.
    monkeypatch.setenv("ATTNKIT_MEMORY_LIMIT", "20GB")
    with pytest.raises(ValueError, match=r"30 layers × 9 heads × 5000 rows × 5000 keys × 4 bytes = 25.1 GiB"):
        smollm2.run(list(range(5000)))
    monkeypatch.delenv("ATTNKIT_MEMORY_LIMIT")
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        smollm2.generate("hi", max_new_tokens=-1)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        smollm2.generate("hi", temperature=-0.5)
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        smollm2.generate("hi", top_k=0)
