"""The models trained on the toy tasks, both with the same interface so that the training
loop does not care which it holds.

Shape letters: ``b`` batch, ``s_in`` input length, ``s_out`` target length (with the EOS),
``s_ctx`` decoder-only context length, ``L`` layers, ``h`` heads, ``e`` model dim,
``v`` vocabulary size.

- :class:`Seq2SeqTransformer`: token embeddings, sinusoidal positions and
  :class:`attnkit.nn.Transformer`, as in "Attention Is All You Need"; greedy decoding
  with the decoder's KV cache.
- :class:`DecoderOnlyTransformer`: :class:`attnkit.nn.DecoderLM` over
  ``<s> input target``, predicting only the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.nn import DecoderLM, SinusoidalPositionalEncoding, Transformer
from attnkit.train.tasks import BOS


@dataclass(frozen=True)
class AttentionMaps:
    """Attention of the positions that produce the target, for pictures and statistics.

    Attributes:
        kind: ``"cross"`` (decoder to encoder) or ``"self"`` (decoder-only).
        weights: ``[L, b, h, s_out, s_k]``: row ``i`` is the query that predicts target
            token ``i``.
        keys: the token ids the columns stand for, ``[b, s_k]``.
    """

    kind: str
    weights: Tensor
    keys: Tensor


def _with_bos(tokens: Tensor) -> Tensor:
    """``[b, s]`` → ``[b, 1 + s]`` starting with the BOS token."""
    bos = torch.full((tokens.shape[0], 1), BOS, dtype=tokens.dtype, device=tokens.device)
    return torch.cat((bos, tokens), dim=1)


class Seq2SeqTransformer(nn.Module):
    """An encoder–decoder Transformer over token ids, post-norm as in the paper.

    The encoder reads the input; the decoder reads ``<s>`` followed by the target so far
    and predicts the next target token.

    Args:
        vocab_size: ``v``, shared by inputs and targets.
        d_model: ``e``.
        heads: attention heads.
        layers: encoder layers, and as many decoder layers.
        ff: feed-forward hidden dim.
        dropout: dropout on the embeddings and inside the layers.

    Raises:
        ValueError: inconsistent sizes (from :class:`attnkit.nn.Transformer`).
    """

    def __init__(self, vocab_size: int, *, d_model: int, heads: int, layers: int, ff: int, dropout: float) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        # As in the paper, embeddings of std 1/√e are multiplied by √e: token entries of
        # unit size, like the encoding's, so that neither drowns the other. (torch's
        # default N(0, 1) times √e drowned the positions: reverse then needed 1750 steps
        # to reach 99% held-out exact match instead of 750.)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)
        self.embed_scale = math.sqrt(d_model)
        self.position = SinusoidalPositionalEncoding(d_model)
        self.dropout = nn.Dropout(dropout)
        self.transformer = Transformer(d_model, heads, layers, layers, ff, dropout)
        self.head = nn.Linear(d_model, vocab_size)

    def _embed(self, tokens: Tensor, start: int = 0) -> Tensor:
        """Token ids ``[b, s]`` at positions ``start ..`` → ``[b, s, e]``."""
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        return self.dropout(self.position(self.embedding(tokens) * self.embed_scale, positions))

    def forward(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """Logits of every target token with teacher forcing.

        Args:
            inputs: ``[b, s_in]``.
            targets: ``[b, s_out]``; the decoder sees ``<s>`` and all but the last.

        Returns:
            ``[b, s_out, v]``.
        """
        hidden = self.transformer(self._embed(inputs), self._embed(_with_bos(targets[:, :-1])))  # [b, s_out, e]
        return self.head(hidden)

    @torch.no_grad()
    def generate(self, inputs: Tensor, length: int) -> Tensor:
        """Greedy decoding: encode once, then decode one token per step, reusing the
        decoder's cached keys and values. Runs in evaluation mode and restores the mode.

        Args:
            inputs: ``[b, s_in]``.
            length: how many tokens to produce.

        Returns:
            ``[b, length]``.
        """
        was_training = self.training
        self.eval()
        try:
            memory = self.transformer.encode(self._embed(inputs))  # [b, s_in, e]
            assert isinstance(memory, Tensor)  # no weights asked for: a bare tensor
            cache = self.transformer.new_cache()
            token = _with_bos(inputs[:, :0])  # [b, 1]
            produced = []
            for step in range(length):
                hidden = self.transformer.decode(self._embed(token, start=step), memory, cache=cache)  # [b, 1, e]
                assert isinstance(hidden, Tensor)
                token = self.head(hidden[:, -1]).argmax(-1, keepdim=True)  # [b, 1]
                produced.append(token)
            return torch.cat(produced, dim=1)  # [b, length]
        finally:
            self.train(was_training)

    @torch.no_grad()
    def attention_maps(self, inputs: Tensor, targets: Tensor) -> AttentionMaps:
        """Cross-attention of every decoder layer while producing ``targets``.

        Args:
            inputs: ``[b, s_in]``.
            targets: ``[b, s_out]``; pass the model's own output to see what it attended
                to while decoding.

        Returns:
            :class:`AttentionMaps` of kind ``"cross"``, weights ``[L, b, h, s_out, s_in]``.
        """
        was_training = self.training
        self.eval()
        try:
            out = self.transformer(self._embed(inputs), self._embed(_with_bos(targets[:, :-1])), return_weights=True)
        finally:
            self.train(was_training)
        weights = torch.stack([layer.cross_attention for layer in out.decoder_weights])  # [L, b, h, s_out, s_in]
        return AttentionMaps("cross", weights, inputs)


class DecoderOnlyTransformer(nn.Module):
    """A GPT-2-style model (pre-norm, GELU, sinusoidal positions) that reads
    ``<s> input`` and continues with the target.

    Args:
        vocab_size: ``v``.
        d_model: ``e``.
        heads: attention heads.
        layers: decoder layers.
        ff: feed-forward hidden dim.
        dropout: dropout on the embeddings and inside the layers.

    Raises:
        ValueError: inconsistent sizes (from :class:`attnkit.nn.DecoderLM`).
    """

    def __init__(self, vocab_size: int, *, d_model: int, heads: int, layers: int, ff: int, dropout: float) -> None:
        super().__init__()
        # Untied head: DecoderLM's tied head reuses the N(0, 1) token embeddings, whose
        # initial logits (std ≈ √e) start training at a loss near 90 instead of ln v.
        self.lm = DecoderLM(
            vocab_size, d_model, heads, layers, ff, positional="sinusoidal", dropout=dropout, tie_embeddings=False
        )

    def _context(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """``<s> input target[:-1]``, ``[b, s_ctx]`` with ``s_ctx = s_in + s_out``."""
        return torch.cat((_with_bos(inputs), targets[:, :-1]), dim=1)

    def forward(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """Logits of every target token with teacher forcing.

        Args:
            inputs: ``[b, s_in]``.
            targets: ``[b, s_out]``.

        Returns:
            ``[b, s_out, v]``: the predictions made at the last input token and after.
        """
        logits = self.lm(self._context(inputs, targets))  # [b, s_ctx, v]
        return logits[:, inputs.shape[1] :]  # [b, s_out, v]

    @torch.no_grad()
    def generate(self, inputs: Tensor, length: int) -> Tensor:
        """Greedy continuation of ``<s> input`` with a KV cache (:meth:`DecoderLM.generate`).

        Args:
            inputs: ``[b, s_in]``.
            length: how many tokens to produce.

        Returns:
            ``[b, length]``.
        """
        return self.lm.generate(_with_bos(inputs), length)[:, 1 + inputs.shape[1] :]  # [b, length]

    @torch.no_grad()
    def attention_maps(self, inputs: Tensor, targets: Tensor) -> AttentionMaps:
        """Self-attention of every layer, restricted to the rows that predict ``targets``.

        Args:
            inputs: ``[b, s_in]``.
            targets: ``[b, s_out]``.

        Returns:
            :class:`AttentionMaps` of kind ``"self"``, weights ``[L, b, h, s_out, s_ctx]``
            over the keys ``<s> input target[:-1]``.
        """
        context = self._context(inputs, targets)  # [b, s_ctx]
        was_training = self.training
        self.eval()
        try:
            out = self.lm(context, return_weights=True)
        finally:
            self.train(was_training)
        weights = torch.stack([layer.self_attention for layer in out.weights])  # [L, b, h, s_ctx, s_ctx]
        return AttentionMaps("self", weights[..., inputs.shape[1] :, :], context)  # [L, b, h, s_out, s_ctx]


def build_model(
    vocab_size: int, *, decoder_only: bool, d_model: int, heads: int, layers: int, ff: int, dropout: float
) -> Seq2SeqTransformer | DecoderOnlyTransformer:
    """The model a task needs: decoder-only or encoder–decoder.

    Raises:
        ValueError: inconsistent sizes.
    """
    cls = DecoderOnlyTransformer if decoder_only else Seq2SeqTransformer
    return cls(vocab_size, d_model=d_model, heads=heads, layers=layers, ff=ff, dropout=dropout)
