"""What the mixture-of-experts families (DeepSeek-V3, Mixtral, Qwen-MoE) share: the
renaming of each expert's tensors and the reading of which layers route.

Hugging Face checkpoints save the experts one by one, ``<block>.experts.N.<name>.weight``;
attnkit's :class:`attnkit.nn.MixtureOfExperts` holds them as ``ff.experts.N.{gate,up,down}_proj``.
"""

from __future__ import annotations

from collections.abc import Mapping

from attnkit.models.checkpoints.config_reader import ConfigReader


def expert_keys(block: str, num_experts: int, names: Mapping[str, str]) -> dict[str, str]:
    """Hugging Face's names → attnkit's, inside a layer, of the router and every expert.

    Args:
        block: the checkpoint's name of the feed-forward block (``mlp``,
            ``block_sparse_moe``).
        num_experts: how many experts each routing layer has.
        names: the checkpoint's projection names → ``gate_proj``, ``up_proj``,
            ``down_proj`` (Mixtral's ``w1``, ``w3``, ``w2``).
    """
    keys = {f"{block}.gate": "ff.gate"}
    for i in range(num_experts):
        keys |= {f"{block}.experts.{i}.{theirs}": f"ff.experts.{i}.{ours}" for theirs, ours in names.items()}
    return keys


def routing_layers(read: ConfigReader, num_layers: int, *, dense_first: int = 0) -> tuple[bool, ...]:
    """Per layer, whether its feed-forward is the mixture: all but the first
    ``dense_first`` (DeepSeek's ``first_k_dense_replace``), every ``decoder_sparse_step``-th
    (Qwen-MoE), none listed in ``mlp_only_layers``.

    Raises:
        CheckpointError: a ``mlp_only_layers`` that is not a list of layer indices.
    """
    step = read.size("decoder_sparse_step", 1)
    dense = read.config.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and 0 <= i < num_layers for i in dense):
        raise read.refuse("mlp_only_layers", f"must list layer indices below {num_layers}, got {dense!r}")
    return tuple(i >= dense_first and (i + 1) % step == 0 and i not in dense for i in range(num_layers))
