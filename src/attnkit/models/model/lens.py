"""TransformerLens-style weights, losses, the logit lens and logit attribution of a
:class:`attnkit.models.Model`, as a mixin over a small protocol (the attributes listed on
:class:`LensMixin`), so that it never imports :mod:`attnkit.models.model.model`.

The weights carry TransformerLens' names and layouts, stacked over layers, read from the
model's own parameters (detached, never copied into new state):

=========== ====================== ============================================================
name        shape                  what, and where a family has none
=========== ====================== ============================================================
``W_E``     ``[v, e]``             the token embedding as stored (Gemma multiplies it by ``√e``
                                   on the way in: :attr:`LensMixin.embedding_scale`)
``W_pos``   ``[n_ctx, e]``         learned absolute positions (GPT-2, BERT); ``None`` for rotary
                                   families, whose positions act inside attention
``W_Q``     ``[L, h, e, d]``       ``q = x @ W_Q[l, i] + b_Q[l, i]``, before the rotary encoding
                                   (and before Qwen 3's and Gemma 3's per-head norm)
``W_K``     ``[L, h_kv, e, d]``    keys of each key/value head (TransformerLens repeats them to
``W_V``     ``[L, h_kv, e, d]``    ``h`` heads; :func:`per_query_head` does)
``W_O``     ``[L, h, d, e]``       each head's slice of the output projection
``W_in``    ``[L, e, f]``          the feed-forward input (SwiGLU: the ``up`` projection)
``W_gate``  ``[L, e, f]``          SwiGLU's gate; ``None`` for an ungated feed-forward (GPT-2,
                                   GPT-NeoX, BERT)
``W_out``   ``[L, f, e]``          the feed-forward output (``down``) projection
``W_U``     ``[e, v]``             the unembedding (``logits = final @ W_U + b_U``)
``b_Q``     ``[L, h, d]``          zeros where the projections have no bias (LLaMA, Mistral,
``b_K``     ``[L, h_kv, d]``       Gemma, Qwen 3, Phi-3); Qwen 2 has ``b_Q``, ``b_K``,
``b_V``     ``[L, h_kv, d]``       ``b_V`` and a zero ``b_O``; GPT-2, GPT-NeoX and BERT all
``b_O``     ``[L, e]``             four
``b_in``    ``[L, f]``             zeros without feed-forward biases (all but GPT-2,
``b_out``   ``[L, e]``             GPT-NeoX, BERT)
``b_U``     ``[v]``                zeros: no supported family has an unembedding bias
=========== ====================== ============================================================

:meth:`LensMixin.processed_weights` gives the same tensors as TransformerLens processes
them (norms folded, centred; :mod:`attnkit.models.model.processed`), beside these.

Shape letters: ``L`` layers, ``h`` query heads, ``h_kv`` key/value heads, ``e`` model dim,
``d`` head dim, ``f`` feed-forward hidden dim, ``v`` vocabulary, ``b`` batch, ``s`` tokens,
``k`` stacked components.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.models.checkpoints.tokenizer import Tokenizer
from attnkit.models.families.family import ModelConfig, ModelFamily
from attnkit.models.model.core import ModelCore
from attnkit.models.model.processed import ProcessedWeights, processed_weights
from attnkit.nn import (
    ActivationCache,
    DecoderLM,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    MultiHeadLatentAttention,
)
from attnkit.nn.feedforward import FeedForward
from attnkit.nn.text_module import TextModule


def per_query_head(weights: Tensor, num_heads: int) -> Tensor:
    """Key or value weights of each key/value head repeated to every query head that
    reads them (grouped-query attention), as TransformerLens lays out ``W_K`` and ``W_V``.

    Args:
        weights: ``[L, h_kv, ...]`` (``W_K``, ``W_V``, ``b_K``, ``b_V``).
        num_heads: ``h``, a multiple of ``h_kv``.

    Returns:
        ``[L, h, ...]``: query head ``i`` gets key/value head ``i // (h / h_kv)``.

    Raises:
        ValueError: ``num_heads`` not a multiple of dimension 1.
    """
    if weights.ndim < 2 or num_heads % weights.shape[1]:
        raise ValueError(f"num_heads={num_heads} must be a multiple of dimension 1 of {list(weights.shape)}")
    return weights.repeat_interleave(num_heads // weights.shape[1], dim=1)


def lm_cross_entropy(
    logits: Tensor, ids: Tensor, *, per_token: bool = False, attention_mask: Tensor | None = None
) -> Tensor:
    """The next-token cross-entropy of logits on the ids they were computed from, as
    TransformerLens' ``loss_fn``: position ``i`` predicts token ``i + 1``.

    Args:
        logits: ``[b, s, v]``.
        ids: ``[b, s]``.
        per_token: return each position's loss instead of their mean.
        attention_mask: ``[b, s]``, ``True`` on tokens: a prediction counts only when it
            reads a token and predicts one.

    Returns:
        The mean over the counted positions (a scalar), or ``[b, s - 1]`` (``0`` where not
        counted).

    Raises:
        ValueError: shapes that do not fit, or fewer than 2 tokens.
    """
    if logits.ndim != 3 or ids.shape != logits.shape[:2]:
        raise ValueError(f"logits must be [b, s, v] and ids [b, s], got {list(logits.shape)} and {list(ids.shape)}")
    if ids.shape[1] < 2:
        raise ValueError(f"a next-token loss needs at least 2 tokens, got {ids.shape[1]}")
    log_probs = F.log_softmax(logits[:, :-1].float(), dim=-1)  # [b, s-1, v]
    losses = -log_probs.gather(-1, ids[:, 1:, None].to(logits.device)).squeeze(-1)  # [b, s-1]
    if attention_mask is None:
        return losses if per_token else losses.mean()
    if attention_mask.shape != ids.shape:
        raise ValueError(f"attention_mask must be [b, s] = {list(ids.shape)}, got {list(attention_mask.shape)}")
    counted = (attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()).to(losses.device)  # [b, s-1]
    losses = losses * counted
    return losses if per_token else losses.sum() / counted.sum().clamp(min=1)


class _HookedRunLike(Protocol):
    """What :meth:`attnkit.models.Model.run_with_hooks` returns, as far as losses read it."""

    @property
    def logits(self) -> Tensor | None: ...


@dataclass(frozen=True)
class LogitAttribution:
    """Direct logit attribution of residual-stream parts (:meth:`LensMixin.logit_attribution`).

    Attributes:
        attributions: ``[k, b, s]``: what each part, normalised by the final norm's scale on
            the actual stream, adds to the logit (or the logit difference) through ``W_U``.
        labels: the ``k`` parts (``"embed"``, ``"0_attn_out"``, ``"L3H2"``, ...).
        logit: ``[b, s]``: the model's actual logit (or logit difference).
        residual: ``[b, s]``: ``logit - attributions.sum(0)``: what no part owns (a
            LayerNorm's bias through ``W_U``, the parts not stacked, and the effect of a
            non-linear final transform such as Gemma 2's logit soft-capping).
        exact: whether the decomposition is linear for this family: then the residual is
            only the bias term and the parts left out. ``False`` when the final transform
            is non-linear (:attr:`final_transform`).
        final_transform: the transform after ``W_U`` (``"softcap(30.0)"``), or ``None``.
    """

    attributions: Tensor
    labels: list[str]
    logit: Tensor
    residual: Tensor
    exact: bool
    final_transform: str | None


class LensMixin(ModelCore):
    """TransformerLens' weights, losses, the logit lens and attribution over the attributes below.

    Attributes (what the mixin reads of its class):
        name, family: for messages.
        module: the network (:class:`attnkit.nn.DecoderLM`, BERT's, an encoder–decoder's).
        model_family: its :class:`attnkit.models.families.family.ModelFamily`.
        config: its :class:`attnkit.models.families.family.ModelConfig`.
        tokenizer: the :class:`attnkit.models.Tokenizer`.
        num_layers, num_heads, num_kv_heads: sizes.
    """

    name: str
    family: str
    module: TextModule
    model_family: ModelFamily
    config: ModelConfig
    tokenizer: Tokenizer
    num_layers: int
    num_heads: int
    num_kv_heads: int

    if TYPE_CHECKING:  # what other mixins define

        def to_single_token(self, token: str, *, what: str = "token") -> int: ...

        def run_with_hooks(
            self, ids: Tensor, *, attention_mask: Tensor | None = None, logits: bool = True
        ) -> _HookedRunLike: ...

    # --- weights ---------------------------------------------------------------------

    @property
    def W_E(self) -> Tensor:  # noqa: N802 (TransformerLens' names)
        """The token embedding ``[v, e]`` as stored (see :attr:`embedding_scale`)."""
        embedding = getattr(self.module, "token_embedding", None)
        if not isinstance(embedding, nn.Embedding):
            raise ValueError(f"{self.name} ({self.family}) has no single token embedding: no W_E")
        return embedding.weight.detach()

    @property
    def embedding_scale(self) -> float:
        """What the token embeddings are multiplied by on the way in: ``√e`` for Gemma,
        ``1.0`` for the others."""
        return float(getattr(self.module, "embedding_scale", None) or 1.0)

    @property
    def W_pos(self) -> Tensor | None:  # noqa: N802
        """Learned absolute positions ``[n_ctx, e]`` (GPT-2, BERT), or ``None`` for a family
        whose positions act inside attention (rotary) or that has none."""
        position = getattr(self.module, "position", None)
        return position.weight.detach() if isinstance(position, LearnedPositionalEmbedding) else None

    @property
    def W_Q(self) -> Tensor:  # noqa: N802
        """Each head's query projection, ``[L, h, e, d]`` (``q = x @ W_Q[l, i] + b_Q[l, i]``,
        before the rotary encoding)."""
        return self._per_head("q_proj", self.num_heads)

    @property
    def W_K(self) -> Tensor:  # noqa: N802
        """Each key/value head's key projection, ``[L, h_kv, e, d]``."""
        return self._per_head("k_proj", self.num_kv_heads)

    @property
    def W_V(self) -> Tensor:  # noqa: N802
        """Each key/value head's value projection, ``[L, h_kv, e, d]``."""
        return self._per_head("v_proj", self.num_kv_heads)

    @property
    def W_O(self) -> Tensor:  # noqa: N802
        """Each head's slice of the output projection, ``[L, h, d, e]`` (a head's
        ``result = z @ W_O[l, i]``)."""
        weights = [self._attention(i).out_proj.weight for i in range(self.num_layers)]  # [e, h * d] each
        return torch.stack([w.view(w.shape[0], self.num_heads, -1).permute(1, 2, 0) for w in weights]).detach()

    @property
    def b_Q(self) -> Tensor:  # noqa: N802
        """Query biases ``[L, h, d]`` (zeros without)."""
        return self._per_head_bias("q_proj", self.num_heads)

    @property
    def b_K(self) -> Tensor:  # noqa: N802
        """Key biases ``[L, h_kv, d]`` (zeros without)."""
        return self._per_head_bias("k_proj", self.num_kv_heads)

    @property
    def b_V(self) -> Tensor:  # noqa: N802
        """Value biases ``[L, h_kv, d]`` (zeros without)."""
        return self._per_head_bias("v_proj", self.num_kv_heads)

    @property
    def b_O(self) -> Tensor:  # noqa: N802
        """Output-projection biases ``[L, e]`` (zeros without)."""
        return torch.stack([_bias(self._attention(i).out_proj) for i in range(self.num_layers)])

    @property
    def W_in(self) -> Tensor:  # noqa: N802
        """The feed-forward input projection ``[L, e, f]`` (SwiGLU's ``up``)."""
        return torch.stack([ff.up_proj.weight.detach().T for ff in self._feed_forwards()])

    @property
    def W_gate(self) -> Tensor | None:  # noqa: N802
        """SwiGLU's gate projection ``[L, e, f]``, or ``None`` for an ungated feed-forward."""
        gates = [ff.gate_proj for ff in self._feed_forwards()]
        if any(gate is None for gate in gates):
            return None
        return torch.stack([gate.weight.detach().T for gate in gates if gate is not None])

    @property
    def W_out(self) -> Tensor:  # noqa: N802
        """The feed-forward output projection ``[L, f, e]``."""
        return torch.stack([ff.down_proj.weight.detach().T for ff in self._feed_forwards()])

    @property
    def b_in(self) -> Tensor:  # noqa: N802
        """Feed-forward input biases ``[L, f]`` (zeros without)."""
        return torch.stack([_bias(ff.up_proj) for ff in self._feed_forwards()])

    @property
    def b_out(self) -> Tensor:  # noqa: N802
        """Feed-forward output biases ``[L, e]`` (zeros without)."""
        return torch.stack([_bias(ff.down_proj) for ff in self._feed_forwards()])

    @property
    def W_U(self) -> Tensor:  # noqa: N802
        """The unembedding ``[e, v]`` (``logits = final @ W_U``, then the family's final
        transform: :meth:`unembed`).

        Raises:
            ValueError: a model without a language-model head (BERT).
        """
        return self._lm_head().weight.detach().T

    @property
    def b_U(self) -> Tensor:  # noqa: N802
        """The unembedding bias ``[v]``: zeros (no supported family has one)."""
        return _bias(self._lm_head())

    def processed_weights(
        self,
        *,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        fold_value_biases: bool = True,
    ) -> ProcessedWeights:
        """The weights as TransformerLens' ``from_pretrained`` processes them by default,
        for multiplying by hand (:mod:`attnkit.models.model.processed` defines each step
        and the norms it applies to); the properties above, the cache, the logit lens and
        logit attribution stay those of the raw weights.

        >>> w = model.processed_weights()
        >>> w.W_U.shape, w.applied   # ([e, v], ('fold_ln', 'center_unembed', 'fold_value_biases')) for LLaMA

        Raises:
            ValueError: a model that is not a pre-norm decoder with LayerNorm or RMSNorm
                (BERT), latent attention or a mixture of experts.
        """
        return processed_weights(
            self,
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights,
            center_unembed=center_unembed,
            fold_value_biases=fold_value_biases,
        )

    def _per_head(self, projection: str, heads: int) -> Tensor:
        """An input projection of every layer as ``[L, heads, e, d]``.

        Raises:
            ValueError: latent attention, whose keys and values come out of a latent.
        """
        self._refuse_latent_attention(projection)
        weights = [getattr(self._attention(i), projection).weight for i in range(self.num_layers)]  # [heads * d, e]
        return torch.stack([w.view(heads, -1, w.shape[1]).transpose(1, 2) for w in weights]).detach()

    def _per_head_bias(self, projection: str, heads: int) -> Tensor:
        """An input projection's bias of every layer as ``[L, heads, d]``."""
        self._refuse_latent_attention(projection)
        return torch.stack(
            [_bias(getattr(self._attention(i), projection)).view(heads, -1) for i in range(self.num_layers)]
        )

    def _refuse_latent_attention(self, projection: str) -> None:
        """Multi-head latent attention has no per-head projection of the residual stream:
        its queries, keys and values pass through latents.

        Raises:
            ValueError: naming the hook points that show them instead.
        """
        if any(isinstance(self._attention(i), MultiHeadLatentAttention) for i in range(self.num_layers)):
            raise ValueError(
                f"{self.name} ({self.family}) uses multi-head latent attention: its queries, keys and values pass "
                f"through latents, so there is no {projection} matrix per head; read the hook points self_attn.q, "
                "self_attn.k, self_attn.v and self_attn.latent instead"
            )

    def _attention(self, layer: int) -> MultiHeadAttention:
        return self.module.self_attention(layer)

    def _feed_forwards(self) -> list[FeedForward]:
        """The feed-forward block of every layer of the stack :meth:`_attention` reads."""
        stack = self.module.decoder if isinstance(self.module, DecoderLM) else getattr(self.module, "encoder", None)
        layers = getattr(stack, "layers", None)
        if layers is None:
            raise ValueError(f"{self.name} ({self.family}) has no single stack of layers")
        blocks = [layer.ff for layer in layers]
        routed = [i for i, block in enumerate(blocks) if not isinstance(block, FeedForward)]
        if routed:
            raise ValueError(
                f"{self.name} ({self.family}) has a mixture of experts in layers {routed}: no single feed-forward "
                "matrix per layer; read its experts (module.decoder.layers[i].ff.experts) or the hook points "
                "ff.router_scores, ff.chosen_experts and ff.expert_weights"
            )
        return blocks

    def _lm_head(self) -> nn.Linear:
        head = getattr(self.module, "lm_head", None)
        if not isinstance(head, nn.Linear):
            raise ValueError(f"{self.name} is an encoder ({self.family}) without a language-model head: no W_U")
        return head

    # --- token directions ------------------------------------------------------------

    def tokens_to_residual_directions(self, tokens: str | int | Sequence[int] | Tensor) -> Tensor:
        """Each token's unembedding direction in the residual stream (a column of
        ``W_U``): what a final stream must point along to raise that logit.

        Args:
            tokens: one token's text, an id, or ids of any shape.

        Returns:
            ``[e]`` for one token, ``[..., e]`` for ids ``[...]``.

        Raises:
            ValueError: a text that is not one token, a model without ``W_U``.
        """
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        ids = torch.as_tensor(tokens, dtype=torch.long)
        return self.W_U.T[ids.to(self.W_U.device)]  # [..., e]

    def accumulated_bias(self, layer: int, *, mlp_input: bool = False) -> Tensor:
        """The sum of the biases the blocks before ``layer`` add to the residual stream,
        as TransformerLens' ``accumulated_bias`` on a model with folded value biases: each
        attention's ``b_O`` plus its value biases through ``W_O`` (every pattern row sums to
        1, so a value bias adds ``Σ_h b_V[h] @ W_O[h]`` at every position), and each
        feed-forward's ``b_out``. Exact for pre-norm stacks whose blocks' outputs reach
        the stream unchanged; Gemma's norms of the block outputs change them (Gemma has no
        biases: zeros).

        Args:
            layer: the layer whose input stream is meant (``0`` gives zeros;
                ``num_layers`` the stream out of the last layer).
            mlp_input: also the attention biases of ``layer`` itself (the stream its
                feed-forward reads).

        Returns:
            ``[e]``.

        Raises:
            ValueError: ``layer`` outside ``[0, num_layers]``.
        """
        if not 0 <= layer <= self.num_layers or (mlp_input and layer == self.num_layers):
            raise ValueError(f"layer must be in [0, {self.num_layers}{')' if mlp_input else ']'}, got {layer}")
        value_bias = per_query_head(self.b_V, self.num_heads)  # [L, h, d]
        attention = self.b_O + torch.einsum("lhd,lhde->le", value_bias, self.W_O)  # [L, e]
        total = attention[:layer].sum(0) + self.b_out[:layer].sum(0)  # [e]
        return total + attention[layer] if mlp_input else total

    # --- logits, losses, lens --------------------------------------------------------

    def unembed(self, normed: Tensor) -> Tensor:
        """Logits of final-normed streams ``[..., e]`` with the family's final transform
        (Gemma 2's soft-capping): what the model itself computes from its final state.

        Raises:
            ValueError: a model without a language-model head.
        """
        self._lm_head()
        logits = self.module.logits(normed)
        assert logits is not None
        return logits

    @property
    def final_transform(self) -> str | None:
        """The non-linear transform after ``W_U`` (``"softcap(30.0)"``), or ``None``."""
        cap = getattr(self.module, "logit_softcap", None)
        return None if cap is None else f"softcap({cap})"

    def logit_lens(self, cache: ActivationCache, *, incl_mid: bool = False) -> tuple[Tensor, list[str]]:
        """The logit lens: the stream into every layer and out of the last, each through the
        final norm (its own scale), ``W_U`` and the family's final transform, so that the
        last entry equals the model's logits.

        Args:
            cache: of :meth:`run_with_cache` (it needs the ``resid_pre``/``resid_post``
                points, and ``resid_mid`` with ``incl_mid``).
            incl_mid: also the stream between each layer's attention and feed-forward.

        Returns:
            ``(logits [k, b, s, v], labels)`` (labels as ``accumulated_resid``'s).

        Raises:
            KeyError: a name the cache did not keep.
            ValueError: a model without a language-model head.
        """
        stack, labels = cache.accumulated_resid(incl_mid=incl_mid)  # [k, b, s, e]
        return self.unembed(cache.apply_ln_to_stack(stack, recompute=True)), labels

    def logit_attribution(
        self,
        cache: ActivationCache,
        token: str | int,
        wrong: str | int | None = None,
        *,
        by: Literal["block", "head"] = "block",
    ) -> LogitAttribution:
        """Direct logit attribution of the parts of the final residual stream, with the
        model's actual logit and what the parts leave unexplained.

        Each part is divided by the scale the final norm computed on the actual stream (so
        the parts are linear in it) and projected on ``W_U[:, token]`` (minus ``wrong``'s).
        Where the family transforms the logits non-linearly (Gemma 2's soft-capping) the
        parts sum to the logit *before* the transform: :attr:`LogitAttribution.exact` is
        ``False`` and :attr:`LogitAttribution.residual` holds the exact difference.

        Args:
            cache: of :meth:`run_with_cache` with every point (``names_filter=None``).
            token: the token (text of one token, or id).
            wrong: another token, for a logit difference.
            by: ``"block"``: embeddings, each attention and feed-forward output; ``"head"``:
                each head's ``result`` (the rest falls in the residual).

        Returns:
            A :class:`LogitAttribution`.

        Raises:
            KeyError: a name the cache did not keep.
            ValueError: an unknown ``by``, a token that is not one token.
        """
        if by not in ("block", "head"):
            raise ValueError(f'by must be "block" or "head", got {by!r}')
        token_id = self.to_single_token(token) if isinstance(token, str) else int(token)
        wrong_id = self.to_single_token(wrong) if isinstance(wrong, str) else wrong
        stack, labels = cache.decompose_resid() if by == "block" else cache.stack_head_results()  # [k, b, s, e]
        attributions = cache.logit_attrs(cache.apply_ln_to_stack(stack), token_id, wrong_id)  # [k, b, s]
        final = cache[self.module.hook_name("final")]  # [b, s, e]
        logits = self.unembed(final)  # [b, s, v]
        logit = logits[..., token_id] - (0 if wrong_id is None else logits[..., wrong_id])  # [b, s]
        return LogitAttribution(
            attributions=attributions,
            labels=labels,
            logit=logit,
            residual=logit - attributions.sum(0),
            exact=self.final_transform is None,
            final_transform=self.final_transform,
        )

    def loss_fn(
        self, logits: Tensor, ids: Tensor, *, per_token: bool = False, attention_mask: Tensor | None = None
    ) -> Tensor:
        """TransformerLens' ``loss_fn``: :func:`lm_cross_entropy` of logits on their ids."""
        return lm_cross_entropy(logits, ids, per_token=per_token, attention_mask=attention_mask)

    def loss(
        self,
        ids: str | Tensor | Sequence[int],
        *,
        per_token: bool = False,
        attention_mask: Tensor | None = None,
        prepend_bos: bool | None = None,
    ) -> Tensor:
        """The model's next-token loss on a text or ids (TransformerLens'
        ``model(text, return_type="loss")``), in the caller's autograd mode and under the
        active hooks.

        Args:
            ids: a text, ids ``[s]``, or ids ``[b, s]``.
            per_token: each position's loss ``[b, s - 1]`` instead of the mean.
            attention_mask: ``[b, s]`` for padded ids (:meth:`to_tokens`).
            prepend_bos: for a text, as :meth:`tokenize` takes it.

        Returns:
            A scalar, or ``[b, s - 1]``.

        Raises:
            ValueError: a model without a language-model head, inputs :meth:`run` refuses.
        """
        if not (isinstance(ids, Tensor) and ids.ndim == 2):
            ids = self.prepare_input(ids, prepend_bos=prepend_bos)[0]  # [1, s]
        logits = self.run_with_hooks(ids, attention_mask=attention_mask).logits  # [b, s, v]
        if logits is None:
            raise ValueError(f"{self.name} is an encoder ({self.family}) without a language-model head: no loss")
        return lm_cross_entropy(logits, ids, per_token=per_token, attention_mask=attention_mask)


def _bias(linear: nn.Linear) -> Tensor:
    """A linear's bias, or zeros of its output size, detached."""
    if linear.bias is not None:
        return linear.bias.detach()
    return torch.zeros(linear.out_features, dtype=linear.weight.dtype, device=linear.weight.device)
