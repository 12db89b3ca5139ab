"""Mixture-of-experts feed-forward (Mixtral, DeepSeek-V3, Qwen-MoE): a router sends each
token to a few of many feed-forward experts and adds their outputs, weighted.

Shape letters: ``b`` batch, ``s`` positions, ``e`` model dim, ``n`` experts, ``k`` experts
per token, ``f`` an expert's hidden dim.

A token's router scores are ``score(x W_r)`` over the ``n`` experts: a softmax (Mixtral,
Qwen) or an element-wise sigmoid (DeepSeek-V3). The ``k`` best-scored experts run on the
token; its output is ``Σ_chosen w_i · expert_i(x)`` with ``w_i`` the chosen scores, divided
by their sum where the checkpoint says so (``norm_topk_prob``) and multiplied by
``routed_scaling_factor``. DeepSeek-V3 chooses with a learned bias added to the scores
(``e_score_correction_bias``, used for the choice only, not the weights) and among the
``topk_group`` best of ``n_group`` groups of experts (a group scored by its two best).
Shared experts run on every token and are added (Qwen2-MoE gates them by a sigmoid).

Hook points (:mod:`attnkit.nn.hooks`) of :class:`MixtureOfExperts`:

- ``router_scores`` ``[b, s, n]``: the scores the choice is made from (softmax
  probabilities or sigmoid scores, before the correction bias); a replaced one changes the
  choice and the weights;
- ``chosen_experts`` ``[b, s, k]``: the indices of the chosen experts (int64), best first;
- ``expert_weights`` ``[b, s, n]``: each expert's weight in the token's output, zero for
  experts not chosen; a replaced one weighs the outputs as it says, so zeroing a column
  ablates that expert (:func:`ablate_experts`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.nn.feedforward import FeedForward
from attnkit.nn.hooks import HookPoint


@dataclass(frozen=True)
class RouterConfig:
    """How a :class:`Router` scores and chooses experts, checked when made.

    Args:
        num_experts: ``n``.
        top_k: ``k``, experts per token.
        scoring: ``"softmax"`` (Mixtral, Qwen) or ``"sigmoid"`` (DeepSeek-V3).
        norm_topk_prob: divide the chosen scores by their sum.
        routed_scaling_factor: multiplies the chosen weights (DeepSeek-V3: 2.5).
        num_groups: experts fall into this many equal groups (DeepSeek's ``n_group``).
        topk_groups: the choice is made within this many best groups (``topk_group``),
            each scored by the sum of its two best scores.
        correction_bias: a learned bias ``[n]`` added to the scores for the choice only
            (DeepSeek's ``e_score_correction_bias``).

    Raises:
        ValueError: sizes out of range (``top_k`` above ``num_experts``, groups that do not
            divide the experts or hold fewer than two, more chosen groups than groups or
            too few experts in them), an unknown scoring, a non-positive scaling factor.
    """

    num_experts: int
    top_k: int
    _: KW_ONLY
    scoring: Literal["softmax", "sigmoid"] = "softmax"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    num_groups: int = 1
    topk_groups: int = 1
    correction_bias: bool = False

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "num_groups", "topk_groups"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k must be at most num_experts={self.num_experts}, got {self.top_k}")
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f'scoring must be "softmax" or "sigmoid", got {self.scoring!r}')
        if not self.routed_scaling_factor > 0:
            raise ValueError(f"routed_scaling_factor must be positive, got {self.routed_scaling_factor!r}")
        if self.num_groups > 1:
            per_group = self.num_experts // self.num_groups
            if self.num_experts % self.num_groups or per_group < 2:
                raise ValueError(
                    f"num_groups must divide num_experts into groups of at least 2, got num_experts="
                    f"{self.num_experts} and num_groups={self.num_groups}"
                )
            if self.topk_groups > self.num_groups or self.topk_groups * per_group < self.top_k:
                raise ValueError(
                    f"topk_groups={self.topk_groups} of {self.num_groups} groups of {per_group} experts cannot "
                    f"hold top_k={self.top_k} experts"
                )


class Router(nn.Module):
    """The router of a mixture of experts: ``weight [n, e]`` (and DeepSeek's
    ``e_score_correction_bias [n]``), computed in float32 as the checkpoints were trained.

    Args:
        embed_dim: ``e``.
        config: a :class:`RouterConfig`.
    """

    def __init__(self, embed_dim: int, config: RouterConfig) -> None:
        super().__init__()
        if not isinstance(config, RouterConfig):
            raise TypeError(f"config must be an attnkit.nn.RouterConfig, got {type(config).__name__}")
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.num_experts, embed_dim))
        self.e_score_correction_bias: Tensor | None
        if config.correction_bias:
            self.register_buffer("e_score_correction_bias", torch.zeros(config.num_experts))
        else:
            self.e_score_correction_bias = None

    def scores(self, x: Tensor) -> Tensor:
        """The router scores of ``x [..., e]``: ``[..., n]`` float32. As the checkpoints
        were trained: a softmax router's logits in the model's dtype (Mixtral, Qwen), a
        sigmoid router's in float32 (DeepSeek-V3)."""
        if self.config.scoring == "softmax":
            return F.linear(x, self.weight).float().softmax(-1)  # [..., n]
        return F.linear(x.float(), self.weight.float()).sigmoid()  # [..., n]

    def choose(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        """The chosen experts of each token and their weights, from ``scores [..., n]``:
        ``(chosen [..., k] int64, weights [..., k] float32)``."""
        config = self.config
        for_choice = scores if self.e_score_correction_bias is None else scores + self.e_score_correction_bias
        if config.num_groups > 1:
            grouped = for_choice.unflatten(-1, (config.num_groups, -1))  # [..., groups, n / groups]
            group_scores = grouped.topk(2, dim=-1).values.sum(-1)  # [..., groups]
            best_groups = group_scores.topk(config.topk_groups, dim=-1).indices  # [..., topk_groups]
            kept = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(-1, best_groups, True)
            for_choice = grouped.masked_fill(~kept.unsqueeze(-1), float("-inf")).flatten(-2)  # [..., n]
        chosen = for_choice.topk(config.top_k, dim=-1).indices  # [..., k]
        weights = scores.gather(-1, chosen)  # [..., k]
        if config.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + (1e-20 if config.scoring == "sigmoid" else 0.0))
        return chosen, weights * config.routed_scaling_factor

    def extra_repr(self) -> str:
        config = self.config
        return (
            f"num_experts={config.num_experts}, top_k={config.top_k}, scoring={config.scoring!r}, "
            f"norm_topk_prob={config.norm_topk_prob}, routed_scaling_factor={config.routed_scaling_factor}, "
            f"groups={config.topk_groups}/{config.num_groups}"
        )


class Expert(nn.Module):
    """One SwiGLU expert, ``down(silu(gate(x)) · up(x))``, without hook points: it runs on
    the tokens routed to it, not on a ``[b, s, e]`` sequence."""

    def __init__(self, embed_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(embed_dim, hidden_dim, bias=False)
        self.up_proj = nn.Linear(embed_dim, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, embed_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """``[t, e]`` → ``[t, e]``."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MixtureOfExperts(nn.Module):
    """A mixture-of-experts feed-forward block (see the module docstring).

    Args:
        embed_dim: ``e``.
        expert_dim: ``f``, each routed expert's hidden dim.
        router: a :class:`RouterConfig`.
        shared_dim: the hidden dim of the shared expert run on every token (DeepSeek's
            ``n_shared_experts · moe_intermediate_size``, Qwen2-MoE's
            ``shared_expert_intermediate_size``); ``None`` for none.
        shared_gate: gate the shared expert by ``sigmoid(x W_g)`` (Qwen2-MoE).

    Raises:
        ValueError: non-positive sizes, ``shared_gate`` without a shared expert.
    """

    def __init__(
        self,
        embed_dim: int,
        expert_dim: int,
        router: RouterConfig,
        *,
        shared_dim: int | None = None,
        shared_gate: bool = False,
    ) -> None:
        super().__init__()
        if embed_dim < 1 or expert_dim < 1 or (shared_dim is not None and shared_dim < 1):
            raise ValueError(
                f"embed_dim, expert_dim and shared_dim must be >= 1, got {embed_dim}, {expert_dim}, {shared_dim}"
            )
        if shared_gate and shared_dim is None:
            raise ValueError("shared_gate=True needs a shared expert (shared_dim)")
        self.embed_dim = embed_dim
        self.gate = Router(embed_dim, router)
        self.experts = nn.ModuleList(Expert(embed_dim, expert_dim) for _ in range(router.num_experts))
        self.shared_experts = (
            None if shared_dim is None else FeedForward(embed_dim, shared_dim, activation="swiglu", bias=False)
        )
        self.shared_expert_gate = nn.Linear(embed_dim, 1, bias=False) if shared_gate else None
        self.router_scores = HookPoint()
        self.chosen_experts = HookPoint()
        self.expert_weights = HookPoint()

    @property
    def num_experts(self) -> int:
        """``n``."""
        return len(self.experts)

    def forward(self, x: Tensor) -> Tensor:
        """``[b, s, e]`` → ``[b, s, e]``."""
        scores = self.router_scores(self.gate.scores(x))  # [b, s, n]
        chosen, weights = self.gate.choose(scores)  # [b, s, k] each
        chosen = self.chosen_experts(chosen)
        dense = torch.zeros_like(scores).scatter_(-1, chosen, weights)  # [b, s, n]
        dense = self.expert_weights(dense)
        tokens = x.reshape(-1, x.shape[-1])  # [b·s, e]
        per_token = dense.reshape(-1, dense.shape[-1])  # [b·s, n]
        out = torch.zeros_like(tokens)  # [b·s, e]
        used = per_token != 0  # [b·s, n]
        for i in used.any(0).nonzero().flatten().tolist():
            rows = used[:, i].nonzero().flatten()  # the tokens routed to expert i
            # The weight is rounded to the model's dtype before the product, as the
            # checkpoints' reference implementations round it (bfloat16 weights: the same
            # rounding, so the same greedy tokens).
            routed = self.experts[i](tokens[rows]) * per_token[rows, i : i + 1].to(tokens.dtype)  # [t, e]
            out.index_add_(0, rows, routed)
        out = out.view_as(x)
        if self.shared_experts is not None:
            shared = self.shared_experts(x)  # [b, s, e]
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out


def ablate_experts(experts: Sequence[int]) -> Callable[[Tensor], Tensor]:
    """A hook for a :class:`MixtureOfExperts`' ``expert_weights`` point that removes the
    given experts' outputs (their weights set to zero; the other chosen experts keep
    theirs), e.g. ``model.hooks({"decoder.layers.1.ff.expert_weights": ablate_experts([3])})``.

    Raises:
        ValueError: no experts, or a negative index.
    """
    chosen = sorted(set(experts))
    if not chosen or chosen[0] < 0:
        raise ValueError(f"experts must be non-negative expert indices, got {list(experts)}")

    def ablate(weights: Tensor) -> Tensor:
        if chosen[-1] >= weights.shape[-1]:
            raise ValueError(f"expert {chosen[-1]} is out of range: this layer has {weights.shape[-1]} experts")
        ablated = weights.clone()
        ablated[..., chosen] = 0
        return ablated

    return ablate
