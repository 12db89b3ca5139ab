"""MiniLM on attnkit modules against transformers' BertModel on the same weights: tokens,
hidden states, sentence embeddings, every layer's and head's attention weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.slow

SENTENCES = [
    "The cat sat on the mat.",
    "A cat is sitting on a rug.",
    "The animal didn't cross the road because it was too tired.",
    "Stock markets fell sharply today.",
]


@pytest.fixture(scope="module")
def reference(hf_minilm):
    """Hugging Face hidden states and attention weights per sentence, and the sentence
    embeddings as sentence-transformers computes them (a padded batch, mean pooling over
    real tokens, L2 normalisation)."""
    model, tokenizer = hf_minilm
    per_sentence = {}
    with torch.no_grad():
        for text in SENTENCES:
            encoded = tokenizer(text, return_tensors="pt")
            result = model(**encoded, output_attentions=True)
            per_sentence[text] = (encoded.input_ids, result.last_hidden_state, result.attentions)
        batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
        hidden = model(**batch).last_hidden_state  # [n, s, e]
    keep = batch.attention_mask.unsqueeze(-1).float()  # [n, s, 1]
    embeddings = F.normalize((hidden * keep).sum(1) / keep.sum(1), dim=-1)  # [n, e]
    return per_sentence, embeddings


@pytest.mark.parametrize("text", SENTENCES)
def test_hidden_states_and_every_attention_map_match_transformers(minilm, reference, text):
    ids, hidden, attentions = reference[0][text]
    run = minilm.run(text)
    assert torch.equal(run.ids, ids)
    assert run.tokens[0] == "[CLS]" and run.tokens[-1] == "[SEP]" and run.logits is None
    assert (run.last_hidden_state - hidden).abs().max() < 1e-4
    assert sorted(run.attentions) == list(range(6))
    for layer, expected in enumerate(attentions):  # [1, 12, s, s]
        assert (run.attentions[layer] - expected).abs().max() < 1e-5, f"layer {layer}"


def test_sentence_embeddings_match_sentence_transformers_recipe(minilm, reference):
    expected = reference[1]
    for i, text in enumerate(SENTENCES):
        hidden = minilm.run(text, return_weights=False).last_hidden_state[0]  # [s, e]
        ours = F.normalize(hidden.mean(0), dim=-1)
        assert F.cosine_similarity(ours, expected[i], dim=0) >= 0.9999
    # And they mean something: the two cat sentences are the closest pair.
    sims = expected @ expected.T
    assert sims[0, 1] > sims[0, 3]


def test_bidirectional_maps_and_errors(minilm):
    run = minilm.run("it was too tired", return_weights=[0], heads=[5])
    weights = run.attentions[0][0, 0]  # [s, s]
    assert weights.triu(1).sum() > 0  # tokens attend to later tokens too
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[0]))
    with pytest.raises(ValueError, match="text is empty"):
        minilm.tokenize("   ")
    with pytest.raises(ValueError, match=r"text is 602 tokens long; minilm reads at most 512 tokens"):
        minilm.run("word " * 600)
    with pytest.raises(ValueError, match="cannot generate"):
        minilm.generate("hello")
