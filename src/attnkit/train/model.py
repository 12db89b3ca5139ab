"""The models trained on the toy tasks, both with the same interface so that the training
loop does not care which it holds.

Shape letters: ``b`` batch, ``s_in`` input length, ``s_out`` target length (with the EOS),
``s_ctx`` decoder-only context length, ``L`` layers, ``h`` heads, ``e`` model dim,
``v`` vocabulary size.

- :class:`EncoderDecoderTransformer`: token embeddings, sinusoidal positions and the stacks of
  :class:`attnkit.nn.Transformer` on :class:`attnkit.nn.EncoderDecoderLM`, as in
  "Attention Is All You Need"; greedy decoding with the decoder's KV cache.
- :class:`DecoderOnlyTransformer`: :class:`attnkit.nn.DecoderLM` over
  ``<s> input target``, predicting only the target.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.nn import DecoderLM, DecoderLMConfig, EncoderDecoderLMOutput, paper_transformer
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


class EncoderDecoderTransformer(nn.Module):
    """An encoder–decoder Transformer over token ids, post-norm as in the paper: the
    :class:`attnkit.nn.EncoderDecoderLM` of :func:`attnkit.nn.paper_transformer`, the
    network that :func:`attnkit.models.load` builds again from the run's folder.

    The encoder reads the input; the decoder reads ``<s>`` followed by the target so far
    and predicts the next target token.

    Args:
        vocab_size: ``v``, shared by inputs and targets.
        d_model: ``e``.
        heads: attention heads.
        layers: encoder layers, and as many decoder layers.
        ff: feed-forward hidden dim.
        dropout: dropout on the embeddings and inside the layers.

    Attributes:
        network: the :class:`attnkit.nn.EncoderDecoderLM`.

    Raises:
        ValueError: inconsistent sizes (from :class:`attnkit.nn.Transformer`).
    """

    def __init__(self, vocab_size: int, *, d_model: int, heads: int, layers: int, ff: int, dropout: float) -> None:
        super().__init__()
        self.network = paper_transformer(
            vocab_size,
            embed_dim=d_model,
            num_heads=heads,
            num_encoder_layers=layers,
            num_decoder_layers=layers,
            ff_dim=ff,
            dropout=dropout,
            decoder_start_token_id=BOS,
        )

    def forward(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """Logits of every target token with teacher forcing.

        Args:
            inputs: ``[b, s_in]``.
            targets: ``[b, s_out]``; the decoder sees ``<s>`` and all but the last.

        Returns:
            ``[b, s_out, v]``.
        """
        logits = self.network(inputs, _with_bos(targets[:, :-1]))  # [b, s_out, v]
        assert isinstance(logits, Tensor)  # no weights asked for: a bare tensor
        return logits

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
            produced = [token[:, None] for token in self.network.stream(inputs, length)]  # each [b, 1]
            return torch.cat(produced, dim=1) if produced else inputs[:, :0]  # [b, length]
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
            out = self.network(inputs, _with_bos(targets[:, :-1]), return_weights=True)
        finally:
            self.train(was_training)
        assert isinstance(out, EncoderDecoderLMOutput)
        cross = []
        for layer in out.decoder_weights:
            assert layer is not None and layer.cross_attention is not None  # every layer was asked for
            cross.append(layer.cross_attention)  # [b, h, s_out, s_in]
        weights = torch.stack(cross)  # [L, b, h, s_out, s_in]
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
            DecoderLMConfig(
                d_model,
                heads,
                ff,
                vocab_size=vocab_size,
                num_layers=layers,
                positional="sinusoidal",
                dropout=dropout,
                tie_embeddings=False,
            )
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
) -> EncoderDecoderTransformer | DecoderOnlyTransformer:
    """The model a task needs: decoder-only or encoder–decoder.

    Raises:
        ValueError: inconsistent sizes.
    """
    cls = DecoderOnlyTransformer if decoder_only else EncoderDecoderTransformer
    return cls(vocab_size, d_model=d_model, heads=heads, layers=layers, ff=ff, dropout=dropout)
