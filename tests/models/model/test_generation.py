"""TransformerLens' options of ``generate``: ``stop_at_eos=False`` (greedy tokens against
``transformers``' greedy generation with no end-of-sequence token), ``eos_token_id`` (one or
several, in place of the checkpoint's), and ``top_p`` (seeded samples against the nucleus
computed from the model's own logits, and against ``transformers``' seeded samples), on
causal decoders and an encoder–decoder."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from attnkit import models
from tests.fixtures.tiny_families import TEXT_LENGTH, VOCAB

transformers = pytest.importorskip("transformers")

NEW = 8


@pytest.fixture(scope="module")
def free(tiny_family_folder):
    """The tiny qwen2 whose checkpoint names no end-of-sequence token."""
    return models.load(tiny_family_folder("qwen2"))


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, TEXT_LENGTH), generator=torch.Generator().manual_seed(1))


def _first_new_token_index(tokens: list[int]) -> int:
    """The first position after the start whose token was not produced before it."""
    return next(i for i in range(1, len(tokens)) if tokens[i] not in tokens[:i])


def _with_eos(folder, copy, eos: int):
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "eos_token_id": eos}))
    return models.load(copy)


def test_greedy_tokens_past_the_eos_equal_transformers_without_an_eos(free, tiny_family_folder, tmp_path):
    folder = tiny_family_folder("qwen2")
    with torch.no_grad():
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
        theirs = hf.generate(_ids(), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)[0, TEXT_LENGTH:].tolist()
    assert list(free.generate_ids(_ids(), max_new_tokens=NEW)) == theirs
    end = _first_new_token_index(theirs)
    ending = _with_eos(folder, tmp_path / "with-eos", theirs[end])
    assert ending.tokenizer.eos_token_ids == {theirs[end]}
    assert list(ending.generate_ids(_ids(), max_new_tokens=NEW)) == theirs[:end]
    assert list(ending.generate_ids(_ids(), max_new_tokens=NEW, stop_at_eos=False)) == theirs
    assert list(ending.generate_ids(_ids(), max_new_tokens=NEW, stop_at_eos=False, use_kv_cache=False)) == theirs
    pieces = list(ending.generate_stream(_ids(), max_new_tokens=NEW, stop_at_eos=False))
    assert [i for piece in pieces for i in piece.ids] == theirs
    text = "".join(ending.generate(_ids(), max_new_tokens=NEW, stop_at_eos=False))
    assert text == ending.tokenizer.decode(theirs)  # the end-of-sequence token's text included
    # eos_token_id replaces the checkpoint's: a token never produced lets the generation run on.
    unseen = next(i for i in range(VOCAB) if i not in theirs)
    assert list(ending.generate_ids(_ids(), max_new_tokens=NEW, eos_token_id=unseen)) == theirs


def test_eos_token_id_ends_at_any_of_its_tokens(free):
    tokens = list(free.generate_ids(_ids(), max_new_tokens=NEW))
    end = _first_new_token_index(tokens)
    assert list(free.generate_ids(_ids(), max_new_tokens=NEW, eos_token_id=tokens[end])) == tokens[:end]
    later = tokens[-1] if tokens[-1] not in tokens[:-1] else tokens[end]
    assert list(free.generate_ids(_ids(), max_new_tokens=NEW, eos_token_id=[later, tokens[end]])) == tokens[:end]
    assert list(free.generate_ids(_ids(), max_new_tokens=NEW, eos_token_id=tokens[end], stop_at_eos=False)) == tokens
    for wrong in (VOCAB, -1, [], [3, VOCAB], True):
        with pytest.raises(ValueError, match=r"eos_token_id must be a token id or a list of token ids in \[0, 128\)"):
            free.generate_ids(_ids(), eos_token_id=wrong)


def _nucleus(probs: torch.Tensor, top_p: float) -> set[int]:
    """The fewest most likely tokens whose probabilities add up to ``top_p`` or more."""
    ordered = probs.argsort(descending=True).tolist()
    kept, mass = [], 0.0
    for token in ordered:
        kept.append(token)
        mass += float(probs[token])
        if mass >= top_p:
            return set(kept)
    return set(kept)


def test_top_p_samples_are_reproducible_and_inside_the_nucleus(free):
    top_p = 0.3
    sampled = list(free.generate_ids(_ids(), max_new_tokens=NEW, temperature=1.0, top_p=top_p, seed=7))
    assert list(free.generate_ids(_ids(), max_new_tokens=NEW, temperature=1.0, top_p=top_p, seed=7)) == sampled
    for step, token in enumerate(sampled):
        prefix = torch.cat([_ids(), torch.tensor([sampled[:step]], dtype=torch.long)], dim=1)
        probs = torch.softmax(free.run(prefix).logits[0, -1].double(), dim=-1)
        assert token in _nucleus(probs, top_p), step
    first = _nucleus(torch.softmax(free.run(_ids()).logits[0, -1].double(), dim=-1), top_p)
    draws = {next(free.generate_ids(_ids(), max_new_tokens=1, temperature=1.0, top_p=top_p, seed=s)) for s in range(24)}
    assert len(first) > 1 and draws <= first and len(draws) > 1  # samples, within the nucleus only
    greedy = list(free.generate_ids(_ids(), max_new_tokens=NEW))
    assert list(free.generate_ids(_ids(), max_new_tokens=NEW, temperature=1.0, top_p=1e-6, seed=0)) == greedy
    assert list(free.generate_ids(_ids(), max_new_tokens=NEW, temperature=1.0, top_k=1, top_p=0.9, seed=0)) == greedy


@pytest.mark.parametrize(("top_k", "top_p"), [(None, 0.5), (20, 0.7)])
def test_seeded_nucleus_samples_equal_transformers_samples(free, tiny_family_folder, top_k, top_p):
    # transformers filters top_k, then top_p, and draws with torch.multinomial from the
    # global generator: seeded alike, the same draws from the same probabilities.
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_family_folder("qwen2"), attn_implementation="eager")
    for seed in range(3):
        ours = list(free.generate_ids(_ids(), max_new_tokens=NEW, temperature=0.8, top_k=top_k, top_p=top_p, seed=seed))
        torch.manual_seed(seed)
        with torch.no_grad():
            theirs = hf.eval().generate(
                _ids(),
                max_new_tokens=NEW,
                min_new_tokens=NEW,
                do_sample=True,
                temperature=0.8,
                top_k=top_k or 0,
                top_p=top_p,
            )
        assert ours == theirs[0, TEXT_LENGTH:].tolist(), seed


@pytest.mark.parametrize("top_p", [0, -0.5, 1.5, float("nan")])
def test_a_top_p_that_is_not_a_probability_mass_is_refused_at_the_call(free, top_p):
    with pytest.raises(ValueError, match=r"top_p must be a probability mass in \(0, 1\]"):
        free.generate("w1 w2", temperature=1.0, top_p=top_p)


def test_encoder_decoder_takes_the_same_options(tiny_t5, tiny_t5_path, tmp_path):
    source = "translate this"
    tokens = list(tiny_t5.generate_ids(source, max_new_tokens=NEW))
    assert len(tokens) == NEW and not set(tokens) & tiny_t5.tokenizer.eos_token_ids
    ending = _with_eos(tiny_t5_path, tmp_path / "t5-with-eos", tokens[0])
    assert list(ending.generate_ids(source, max_new_tokens=NEW)) == []
    assert list(ending.generate_ids(source, max_new_tokens=NEW, stop_at_eos=False)) == tokens
    assert list(tiny_t5.generate_ids(source, max_new_tokens=NEW, eos_token_id=[5, tokens[0]])) == []
    sampled = list(tiny_t5.generate_ids(source, max_new_tokens=NEW, temperature=1.0, top_p=0.5, seed=3))
    assert sampled == list(tiny_t5.generate_ids(source, max_new_tokens=NEW, temperature=1.0, top_p=0.5, seed=3))
