"""Multi-head latent attention (MLA, DeepSeek-V2 and V3): keys and values through a small
shared latent, so that a KV cache keeps the latent instead of every head's keys and values.

Shape letters: ``b`` batch, ``h`` heads, ``s_q`` query length, ``s_k`` key length, ``e``
model dim, ``r`` the KV latent (``kv_lora_rank``), ``r_q`` the query latent
(``q_lora_rank``), ``d_n`` the part of a query/key head without position
(``qk_nope_head_dim``), ``d_r`` the rotary part (``qk_rope_head_dim``), ``d_v`` the value
head dim.

Multi-head attention projects each token to ``h`` keys and ``h`` values; grouped-query
attention shares them between groups of query heads. MLA projects each token down to one
latent ``c [r]`` (normalised) and one rotary key ``k_r [d_r]`` shared by every head; each
head's key is ``[W_K^i c ; k_r]`` and its value ``W_V^i c``, with ``W_K^i`` and ``W_V^i``
the slices of one up-projection (``kv_b_proj``). Queries go through their own latent
``r_q`` (or one projection when ``q_lora_rank`` is ``None``) and split the same way into
``[q_n ; q_r]``. Since the rotation depends on the position, it cannot pass through the
up-projection: the rotary part is kept apart (decoupled) and rotated on its own.

A cached token costs ``r + d_r`` numbers per layer instead of ``2 · h_kv · d``: DeepSeek-V3
keeps 512 + 64 where its 128 heads would keep 2 · 128 · 128 (one 57th).
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

import torch
from torch import Tensor, nn

from attnkit.functional.masks import Mask
from attnkit.nn.attention import AttentionConfig
from attnkit.nn.hooked_attention import MultiHeadAttention
from attnkit.nn.hooks import HookPoint
from attnkit.nn.kv_cache import KVCache
from attnkit.nn.norms import RMSNorm
from attnkit.nn.positional import AttentionPositional
from attnkit.nn.records import MultiHeadOutput, forward_of_record
from attnkit.nn.rope_scaling import yarn_mscale
from attnkit.nn.weight_selection import WeightSelection

__all__ = ["LatentAttentionConfig", "MultiHeadLatentAttention", "yarn_mscale"]


@dataclass(frozen=True)
class LatentAttentionConfig:
    """What :class:`MultiHeadLatentAttention` is built from, checked when the config is made.

    Args:
        embed_dim: model dim ``e``.
        num_heads: heads ``h``.
        kv_lora_rank: ``r``, the size of the latent keys and values are made from.
        qk_nope_head_dim: ``d_n``, the part of each query and key head without position.
        qk_rope_head_dim: ``d_r``, the rotary part (one rotary key shared by the heads).
        v_head_dim: ``d_v``, the size of each value head.
        q_lora_rank: ``r_q``, the query latent; ``None`` projects queries in one matrix.
        bias: biases on the down-projections and the output projection (DeepSeek's
            ``attention_bias``).
        scale: multiplies the scores; default ``(d_n + d_r) ** -0.5`` (times YaRN's
            ``mscale²`` where a checkpoint extends its context with it:
            :func:`yarn_mscale`).
        interleaved_rotary: the checkpoint lays the rotary dims out in pairs
            ``(x0, x1), (x2, x3), …`` (DeepSeek's ``rope_interleave``); they are regrouped
            as halves before the rotation, as transformers does.
        norm_eps: epsilon of the RMSNorms on the latents.

    Raises:
        ValueError: a size below 1, an odd ``qk_rope_head_dim``, a non-positive scale.
        TypeError: a size that is not an int.
    """

    embed_dim: int
    num_heads: int
    _: KW_ONLY
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    bias: bool = False
    scale: float | None = None
    interleaved_rotary: bool = False
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        sizes = {
            "embed_dim": self.embed_dim,
            "num_heads": self.num_heads,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
        }
        if self.q_lora_rank is not None:
            sizes["q_lora_rank"] = self.q_lora_rank
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even (rotated in pairs), got {self.qk_rope_head_dim}")
        if self.scale is not None and not self.scale > 0:
            raise ValueError(f"scale must be a positive number, got {self.scale!r}")

    @property
    def qk_head_dim(self) -> int:
        """``d_n + d_r``, the size of each query and key head."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def cached_numbers_per_token(self) -> int:
        """What a KV cache keeps per token and layer: ``r + d_r``."""
        return self.kv_lora_rank + self.qk_rope_head_dim


class MultiHeadLatentAttention(MultiHeadAttention):
    """Multi-head latent attention (see the module docstring) with the hook points, maps and
    kernels of :class:`attnkit.nn.MultiHeadAttention`, and a KV cache of latents.

    Submodules, under DeepSeek's names: ``q_proj`` (without a query latent) or
    ``q_a_proj`` → ``q_a_norm`` → ``q_b_proj``; ``kv_a_proj`` (``e → r + d_r``) →
    ``kv_a_norm`` on the latent; ``kv_b_proj`` (``r → h · (d_n + d_v)``); ``out_proj``.

    Hook points: those of :class:`attnkit.nn.MultiHeadAttention` (``q`` and ``k``
    ``[b, h, s, d_n + d_r]``, ``v`` and ``z`` ``[b, h, s, d_v]``, ``scores``, ``pattern``,
    ``result``) plus ``latent`` ``[b, s, r]`` (the normalised KV latent of the new
    positions, what the cache keeps) and ``rotary_key`` ``[b, 1, s, d_r]`` (the rotated
    key shared by the heads). A replaced ``latent`` or ``rotary_key`` is what the cache
    keeps; a replaced ``k`` or ``v`` acts on the current call only, since the cache keeps
    latents.

    The :class:`attnkit.nn.KVCache` given to it holds the latents as its keys
    ``[b, 1, s, r]`` and the rotary keys as its values ``[b, 1, s, d_r]``; each call
    projects them up to every head's keys and values.

    Args:
        config: a :class:`LatentAttentionConfig`.
        positional: the rotary encoding of the ``d_r`` dims.

    Raises:
        TypeError: a config that is not a ``LatentAttentionConfig``, a positional encoding
            that is not an ``AttentionPositional``.
        ValueError: a positional encoding built for another head dim than ``d_r``.
    """

    def __init__(self, config: LatentAttentionConfig, *, positional: AttentionPositional | None = None) -> None:
        if not isinstance(config, LatentAttentionConfig):
            raise TypeError(f"config must be an attnkit.nn.LatentAttentionConfig, got {type(config).__name__}")
        scale = config.qk_head_dim**-0.5 if config.scale is None else config.scale
        # The value head dim is the head dim of what leaves attention (z, result, out_proj).
        super().__init__(
            AttentionConfig(
                config.embed_dim,
                config.num_heads,
                head_dim=config.v_head_dim,
                bias=False,
                out_bias=config.bias,
                scale=scale,
            )
        )
        del self.q_proj, self.k_proj, self.v_proj
        self.latent_config = config
        e, h, r = config.embed_dim, config.num_heads, config.kv_lora_rank
        self.positional = _rotary_part(positional, config.qk_rope_head_dim)
        self.q_a_proj: nn.Linear | None = None
        self.q_a_norm: RMSNorm | None = None
        self.q_b_proj: nn.Linear | None = None
        # One query projection only without a query latent (DeepSeek's name for it).
        self.q_proj: nn.Linear | None = None  # type: ignore[assignment]
        if config.q_lora_rank is None:
            self.q_proj = nn.Linear(e, h * config.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(e, config.q_lora_rank, bias=config.bias)
            self.q_a_norm = RMSNorm(config.q_lora_rank, eps=config.norm_eps)
            self.q_b_proj = nn.Linear(config.q_lora_rank, h * config.qk_head_dim, bias=False)
        self.kv_a_proj = nn.Linear(e, r + config.qk_rope_head_dim, bias=config.bias)
        self.kv_a_norm = RMSNorm(r, eps=config.norm_eps)
        self.kv_b_proj = nn.Linear(r, h * (config.qk_nope_head_dim + config.v_head_dim), bias=False)
        # The latent's points come before the heads' (the order the forward pass meets them).
        points = {name: self._modules.pop(name) for name in ("q", "k", "v", "scores", "pattern", "z", "result")}
        self.latent = HookPoint()
        self.rotary_key = HookPoint(positions=(2,))
        for name, point in points.items():
            setattr(self, name, point)

    @property
    def packable(self) -> bool:
        """Never: the latent projections are not the q/k/v triple that packing joins."""
        return False

    def forward_record(
        self,
        x: Tensor,
        context: Tensor | tuple[Tensor, Tensor] | None = None,
        *,
        mask: Mask | Tensor | None = None,
        causal: bool = False,
        positions: Tensor | None = None,
        kv_cache: KVCache | None = None,
        position_bias: Tensor | None = None,
        return_weights: bool | WeightSelection = False,
    ) -> MultiHeadOutput:
        """Self-attention of ``x`` ``[b, s_q, e]``; the arguments are those of
        :meth:`attnkit.nn.MultiHeadAttention.forward_record` (``context`` and
        ``position_bias`` must be ``None``: MLA is self-attention with a rotary encoding).

        Raises:
            ValueError: a context or position bias, shapes that do not fit.
            TypeError: non-float inputs, a ``kv_cache`` that is not a ``KVCache``.
        """
        if context is not None or position_bias is not None:
            raise ValueError("multi-head latent attention is self-attention: pass neither context= nor position_bias=")
        self._check_forward(x, None, positions, kv_cache)
        config = self.latent_config
        h, d_n, d_r = self.num_heads, config.qk_nope_head_dim, config.qk_rope_head_dim
        past = 0 if kv_cache is None else len(kv_cache)
        q = self._split_heads(self._query_projection(x), h)  # [b, h, s_q, d_n + d_r]
        latent, rotary_key = self.kv_a_proj(x).split([config.kv_lora_rank, d_r], dim=-1)  # [b, s_q, r], [b, s_q, d_r]
        latent = self.latent(self.kv_a_norm(latent))  # [b, s_q, r]
        q_rotary = self._rotate(self._halves(q[..., d_n:]), positions, past)  # [b, h, s_q, d_r]
        rotary_key = self.rotary_key(self._rotate(self._halves(rotary_key.unsqueeze(1)), positions, past))
        q = self.q(torch.cat((q[..., :d_n], q_rotary), dim=-1))  # [b, h, s_q, d_n + d_r]
        latents, rotary_keys = latent.unsqueeze(1), rotary_key  # [b, 1, s_q, r], [b, 1, s_q, d_r]
        if kv_cache is not None:
            latents, rotary_keys = kv_cache.append(latents, rotary_keys)  # [b, 1, s_k, r], [b, 1, s_k, d_r]
        k, v = self._keys_and_values(latents[:, 0], rotary_keys)  # [b, h, s_k, d_n + d_r], [b, h, s_k, d_v]
        if past:
            k = torch.cat((k[:, :, :past], self.k(k[:, :, past:])), dim=2)
            v = torch.cat((v[:, :, :past], self.v(v[:, :, past:])), dim=2)
        else:
            k, v = self.k(k), self.v(v)
        attended = self._attend_step(
            q,
            k,
            v,
            mask=mask,
            bias=None,
            causal=causal,
            return_weights=return_weights,
            kv_cache=kv_cache,
            position_bias=None,
        )  # [b, h, s_q, d_v]
        return MultiHeadOutput(self._output(attended.output), attended.weights)  # [b, s_q, e]

    forward = forward_of_record(forward_record)

    def _query_projection(self, x: Tensor) -> Tensor:
        """``[b, s, e]`` → ``[b, s, h · (d_n + d_r)]``, through the query latent if any."""
        if self.q_proj is not None:
            return self.q_proj(x)
        assert self.q_a_proj is not None and self.q_a_norm is not None and self.q_b_proj is not None
        return self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))

    def _keys_and_values(self, latents: Tensor, rotary_keys: Tensor) -> tuple[Tensor, Tensor]:
        """Every head's keys and values from the latents ``[b, s, r]`` and the shared rotary
        keys ``[b, 1, s, d_r]``: ``[b, h, s, d_n + d_r]`` and ``[b, h, s, d_v]``."""
        config = self.latent_config
        d_n = config.qk_nope_head_dim
        up = self._split_heads(self.kv_b_proj(latents), self.num_heads)  # [b, h, s, d_n + d_v]
        keys_nope, values = up.split([d_n, config.v_head_dim], dim=-1)
        keys = torch.cat((keys_nope, rotary_keys.expand(-1, self.num_heads, -1, -1)), dim=-1)
        return keys, values

    def _halves(self, t: Tensor) -> Tensor:
        """Interleaved rotary pairs ``(x0, x1), (x2, x3), …`` regrouped as halves
        ``(x0, x2, …, x1, x3, …)``, the layout :class:`attnkit.nn.RotaryEmbedding` turns;
        ``t`` as it is for a checkpoint laid out in halves."""
        if not self.latent_config.interleaved_rotary:
            return t
        return torch.cat((t[..., 0::2], t[..., 1::2]), dim=-1)

    def extra_repr(self) -> str:
        config = self.latent_config
        parts = [
            f"embed_dim={self.embed_dim}",
            f"num_heads={self.num_heads}",
            f"q_lora_rank={config.q_lora_rank}",
            f"kv_lora_rank={config.kv_lora_rank}",
            f"qk_nope_head_dim={config.qk_nope_head_dim}",
            f"qk_rope_head_dim={config.qk_rope_head_dim}",
            f"v_head_dim={config.v_head_dim}",
            f"scale={self.scale:.6g}",
        ]
        if config.interleaved_rotary:
            parts.append("interleaved_rotary=True")
        return ", ".join(parts)


def _rotary_part(positional: AttentionPositional | None, rotary_dim: int) -> AttentionPositional | None:
    """The encoding of the rotary part: one that rotates ``d_r``-dim heads.

    Raises:
        TypeError: not an ``AttentionPositional``, or one that biases scores instead of
            rotating.
        ValueError: built for another head dim.
    """
    if positional is None:
        return None
    if not isinstance(positional, AttentionPositional) or not positional.takes_positions:
        raise TypeError(
            f"positional must be a rotary AttentionPositional (RotaryEmbedding), got {type(positional).__name__}"
        )
    if positional.head_dim is not None and positional.head_dim != rotary_dim:
        raise ValueError(
            f"{type(positional).__name__} was built for head_dim {positional.head_dim}, but the rotary part of "
            f"this attention has qk_rope_head_dim {rotary_dim}"
        )
    return positional
