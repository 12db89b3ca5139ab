"""Tiny random encoder–decoder checkpoints written by ``transformers`` itself (its own
config classes and ``save_pretrained``), with a word-level ``tokenizer.json`` that adds
the family's special tokens: the folders attnkit's T5 and BART parity tests load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

WORDS = "the cat sat on mat a dog ran to park big red blue house tree river and of in is was".split()
VOCAB_SIZE = 99


def _tokenizer(specials: list[str], template: str, size: int = VOCAB_SIZE) -> str:
    """A whitespace word-level tokenizer of ``size`` ids: ``specials`` first (ids 0, 1,
    ...), then :data:`WORDS`, then ``w0``, ``w1``, ... (so that, with ``size`` the
    model's vocabulary, every id a random model produces has a string), with a
    post-processor that wraps a text as ``template`` says."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    known = [*specials, *WORDS]
    filler = [f"w{i}" for i in range(size - len(known))]
    vocab = {token: i for i, token in enumerate(known + filler)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(specials)
    used = [token for token in specials if token in template.split()]
    backend.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(token, vocab[token]) for token in used]
    )
    return backend.to_str()


def write_t5(
    folder: Path, *, gated: bool = False, seed: int = 0, tokenizer_size: int = VOCAB_SIZE, **sizes: Any
) -> Path:
    """A tiny random T5 (v1.1 with a gated-GELU feed-forward when ``gated``): 2 encoder and
    3 decoder layers, ``d_model`` 32, 4 heads, a vocabulary of :data:`VOCAB_SIZE` (``sizes`` override the
    config's fields), and a tokenizer of ``tokenizer_size`` ids (fewer than the
    embedding's rows, as in real T5: 32,100 ids for 32,128 rows)."""
    from transformers import T5Config, T5ForConditionalGeneration

    fields: dict[str, Any] = dict(
        vocab_size=VOCAB_SIZE,
        d_model=32,
        d_kv=8,
        d_ff=48,
        num_layers=2,
        num_decoder_layers=3,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
        feed_forward_proj="gated-gelu" if gated else "relu",
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    torch.manual_seed(seed)
    model = T5ForConditionalGeneration(T5Config(**(fields | sizes)))
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(_tokenizer(["<pad>", "</s>", "<unk>"], "$A </s>", tokenizer_size))
    return folder


def write_bart(folder: Path, *, seed: int = 0, **sizes: Any) -> Path:
    """A tiny random BART: 2 encoder and 3 decoder layers, ``d_model`` 32, 4 heads, 64
    positions, a vocabulary of :data:`VOCAB_SIZE` (``sizes`` override the config's fields)."""
    from transformers import BartConfig, BartForConditionalGeneration

    fields: dict[str, Any] = dict(
        vocab_size=VOCAB_SIZE,
        d_model=32,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        max_position_embeddings=64,
        bos_token_id=0,
        pad_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    torch.manual_seed(seed)
    model = BartForConditionalGeneration(BartConfig(**(fields | sizes)))
    # transformers starts final_logits_bias at zero; a random one checks that it is read.
    model.final_logits_bias.normal_(0, 0.5)
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(_tokenizer(["<s>", "<pad>", "</s>", "<unk>"], "<s> $A </s>"))
    return folder


def config_of(folder: Path) -> dict[str, Any]:
    """The folder's parsed ``config.json``."""
    return json.loads((folder / "config.json").read_text())
