"""``MultiHeadAttention(kernel="ring")`` inside gloo processes: each rank runs the module on
its shard of the sequence and the gathered result equals the module on the whole sequence,
parameter gradients (summed over ranks) included."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.processes import run_ranks

# Several processes each (torchrun-style ranks): seconds per test, left out of make test-fast.
pytestmark = pytest.mark.slow


def _check_ring_module(rank: int, world: int) -> None:
    import torch.distributed as dist

    import attnkit.distributed as ad
    from attnkit import masks
    from attnkit.nn import AttentionConfig, MultiHeadAttention, RotaryEmbedding

    seq_len = 21
    for layout in ("contiguous", "zigzag"):
        for mask, causal in ((None, True), (masks.sliding_window(5), False)):
            torch.manual_seed(0)
            ring = MultiHeadAttention(
                AttentionConfig(
                    24, 4, num_kv_heads=2, kernel="ring", kernel_options={"layout": layout, "block_size": 4}
                ),
                positional=RotaryEmbedding(6),
            ).double()
            whole = MultiHeadAttention(AttentionConfig(24, 4, num_kv_heads=2), positional=RotaryEmbedding(6)).double()
            whole.load_state_dict(ring.state_dict())
            x = torch.randn(2, seq_len, 24, dtype=torch.float64)
            target = torch.randn(2, seq_len, 24, dtype=torch.float64)

            expected = whole(x, mask=mask, causal=causal)
            (expected * target).sum().backward()

            positions = ad.shard_positions(seq_len, rank, world, layout)
            out_local = ring(ad.shard(x, dim=1, layout=layout), mask=mask, causal=causal, positions=positions)
            (out_local * ad.shard(target, dim=1, layout=layout)).sum().backward()
            got = ad.gather(out_local.detach(), dim=1, layout=layout)
            assert (got - expected.detach()).abs().max() < 1e-10, (layout, mask)
            for (name, p_ring), p_whole in zip(ring.named_parameters(), whole.parameters()):
                grad = p_ring.grad.clone()
                dist.all_reduce(grad)
                assert (grad - p_whole.grad).abs().max() < 1e-10, (layout, mask, name)


@pytest.mark.timeout(120)
def test_multi_head_attention_ring_kernel_matches_whole_sequence():
    run_ranks(_check_ring_module, 2, timeout=90)


def test_ring_kernel_rejects_a_score_bias_and_registers_on_import():
    import attnkit.distributed  # noqa: F401  (registers "ring")
    from attnkit.functional import get_kernel
    from attnkit.nn import ALiBi, AttentionConfig, MultiHeadAttention

    assert get_kernel("ring") is attnkit.distributed.ring_kernel
    module = MultiHeadAttention(AttentionConfig(16, 2, kernel="ring"), positional=ALiBi(2))
    with pytest.raises(ValueError, match="no score bias"):
        module(torch.zeros(1, 4, 16))
