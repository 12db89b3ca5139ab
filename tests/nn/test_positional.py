"""Each positional encoding against its formula."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.nn import (
    ALiBi,
    LearnedPositionalEmbedding,
    RelativePositionBias,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_slopes,
    relative_position_bucket,
)
from tests.nn.helpers import assert_close

# ---------------------------------------------------------------------------------------
# Sinusoidal.
# ---------------------------------------------------------------------------------------


def test_sinusoidal_matches_the_papers_formula() -> None:
    d_model = 512
    pe = SinusoidalPositionalEncoding(d_model)
    table = pe.encodings(torch.arange(600))  # [600, 512]
    assert table.shape == (600, d_model)
    assert table[3, 0].item() == pytest.approx(math.sin(3), abs=1e-7)
    assert table[3, 1].item() == pytest.approx(math.cos(3), abs=1e-7)
    for pos in (0, 3, 4, 500, 599):
        for i in (0, 5, 150, 255):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=2e-5)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=2e-5)


def test_sinusoidal_near_positions_are_alike_far_ones_differ() -> None:
    table = SinusoidalPositionalEncoding(512).encodings(torch.tensor([3, 4, 500]))
    assert (table[0] - table[1]).norm() < (table[0] - table[2]).norm()


def test_sinusoidal_is_added_and_stays_out_of_the_state_dict() -> None:
    pe = SinusoidalPositionalEncoding(8)
    x = torch.randn(2, 5, 8)
    assert_close(pe(x), x + pe.encodings(torch.arange(5)))
    assert_close(pe(x[:, 2:3], torch.tensor([2])), pe(x)[:, 2:3])
    assert list(pe.state_dict()) == [] and list(pe.parameters()) == []
    assert "denominators" in dict(pe.named_buffers())


def test_learned_embedding_adds_its_rows() -> None:
    pe = LearnedPositionalEmbedding(10, 4)
    x = torch.randn(2, 3, 4)
    assert_close(pe(x), x + pe.weight[:3])
    assert_close(pe(x, torch.tensor([[7, 8, 9], [0, 1, 2]]))[0], x[0] + pe.weight[7:])
    with pytest.raises(ValueError, match=r"positions must be in \[0, 10\)"):
        pe(x, torch.tensor([8, 9, 10]))
    assert list(pe.state_dict()) == ["weight"]


def test_absolute_encoding_errors() -> None:
    with pytest.raises(ValueError, match="even"):
        SinusoidalPositionalEncoding(7)
    with pytest.raises(ValueError, match=r"expected x of shape \[b, s, e\] with e = 8"):
        SinusoidalPositionalEncoding(8)(torch.randn(2, 3, 6))
    with pytest.raises(TypeError, match="integer"):
        SinusoidalPositionalEncoding(8)(torch.randn(2, 3, 8), torch.arange(3.0))


# ---------------------------------------------------------------------------------------
# Rotary.
# ---------------------------------------------------------------------------------------


def test_rotary_dot_product_depends_only_on_position_difference() -> None:
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, theta=10000.0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m: int, n: int) -> float:
        return (rope.rotate(q, torch.tensor([m])) * rope.rotate(k, torch.tensor([n]))).sum().item()

    for offset in (0, 1, 5, 50):
        assert score(3 + offset, 1 + offset) == pytest.approx(score(3, 1), abs=1e-4)
        assert score(1 + offset, 9 + offset) == pytest.approx(score(1, 9), abs=1e-4)
    assert score(3, 1) != pytest.approx(score(1, 3), abs=1e-3)


def test_rotary_tables_give_bit_identical_rotations() -> None:
    torch.manual_seed(2)
    tabled, computed = RotaryEmbedding(64, theta=1e5, max_positions=16).to("cpu"), RotaryEmbedding(64, theta=1e5)
    x = torch.randn(2, 3, 5, 64)
    for start in (0, 7, 11, 40):  # 11 + 5 reaches past the table: computed on the fly
        expected = computed.rotate(x, torch.arange(start, start + 5))
        assert torch.equal(tabled.rotate_from(x, start), expected)
        assert torch.equal(computed.rotate_from(x, start), expected)
    assert torch.equal(tabled(x), computed(x))
    assert not any("table" in name for name in tabled.state_dict())
    with pytest.raises(ValueError, match="max_positions must be >= 1"):
        RotaryEmbedding(8, max_positions=0)


def test_rotary_is_the_half_split_rotation() -> None:
    torch.manual_seed(1)
    d, theta = 8, 100000.0
    rope = RotaryEmbedding(d, theta=theta)
    x = torch.randn(2, 3, 5, d, dtype=torch.float64)
    out = rope.rotate(x, torch.arange(5)).double()
    for pos in range(5):
        for j in range(d // 2):
            angle = pos * theta ** (-2 * j / d)
            a, b = x[..., pos, j], x[..., pos, j + d // 2]  # pair (j, j + d/2)
            assert_close(out[..., pos, j], a * math.cos(angle) - b * math.sin(angle))
            assert_close(out[..., pos, j + d // 2], a * math.sin(angle) + b * math.cos(angle))
    # A rotation keeps lengths.
    assert_close(out.norm(dim=-1), x.norm(dim=-1))


def test_rotary_per_row_positions_and_buffers() -> None:
    rope = RotaryEmbedding(4)
    x = torch.randn(2, 3, 4, 4)
    positions = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])
    out = rope.rotate(x, positions)
    assert_close(out[1], rope.rotate(x[1:], torch.arange(5, 9))[0])
    assert_close(rope(x), rope.rotate(x, torch.arange(4)))
    assert list(rope.state_dict()) == []
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(5)


# ---------------------------------------------------------------------------------------
# ALiBi.
# ---------------------------------------------------------------------------------------


def test_alibi_slopes_follow_the_paper() -> None:
    assert alibi_slopes(8) == pytest.approx([2.0 ** -(i + 1) for i in range(8)])
    assert alibi_slopes(16) == pytest.approx([2.0 ** (-0.5 * (i + 1)) for i in range(16)])
    # Not a power of two: the 8-head slopes, then every other 16-head slope.
    every_other_of_16 = [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    assert alibi_slopes(12) == pytest.approx([2.0 ** -(i + 1) for i in range(8)] + every_other_of_16)


def test_alibi_bias_is_minus_slope_times_distance() -> None:
    alibi = ALiBi(4)
    bias = alibi(3, 5)  # 3 queries at positions 2, 3, 4
    assert bias.shape == (1, 4, 3, 5)
    slopes = alibi_slopes(4)
    for h in range(4):
        for i in range(3):
            for j in range(5):
                assert bias[0, h, i, j].item() == pytest.approx(-slopes[h] * abs(i + 2 - j))
    assert list(alibi.state_dict()) == []


# ---------------------------------------------------------------------------------------
# T5 relative position buckets.
# ---------------------------------------------------------------------------------------


def _t5_bucket(rel: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """T5's bucketing written out for one scalar."""
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        if rel > 0:
            bucket += num_buckets
        n = abs(rel)
    else:
        n = max(-rel, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return bucket + min(large, num_buckets - 1)


def test_t5_buckets_known_values() -> None:
    rel = torch.tensor([0, -1, 1, -7, -8, -16, -127, -128, -1000, 16, 1000])
    buckets = relative_position_bucket(rel, bidirectional=True, num_buckets=32, max_distance=128)
    assert buckets.tolist() == [0, 1, 17, 7, 8, 10, 15, 15, 15, 26, 31]
    causal = relative_position_bucket(rel, bidirectional=False, num_buckets=32, max_distance=128)
    assert causal.tolist() == [0, 1, 0, 7, 8, 16, 31, 31, 31, 0, 0]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (8, 20)])
def test_t5_buckets_match_the_scalar_formula(bidirectional: bool, num_buckets: int, max_distance: int) -> None:
    rel = torch.arange(-300, 301)
    buckets = relative_position_bucket(
        rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    expected = [_t5_bucket(r, bidirectional, num_buckets, max_distance) for r in rel.tolist()]
    assert buckets.tolist() == expected
    assert buckets.min() >= 0 and buckets.max() < num_buckets


def test_t5_buckets_match_hugging_face() -> None:
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    rel = torch.arange(-300, 301)[None, :]
    for bidirectional in (True, False):
        ours = relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=32, max_distance=128)
        theirs = t5.T5Attention._relative_position_bucket(
            rel, bidirectional=bidirectional, num_buckets=32, max_distance=128
        )
        assert torch.equal(ours, theirs)


def test_relative_position_bias_looks_up_its_weights() -> None:
    torch.manual_seed(2)
    rpb = RelativePositionBias(3, num_buckets=8, max_distance=20)
    bias = rpb(2, 4)  # queries at positions 2 and 3
    for i in range(2):
        for j in range(4):
            bucket = _t5_bucket(j - (i + 2), True, 8, 20)
            assert_close(bias[0, :, i, j], rpb.weight[bucket])
    assert list(rpb.state_dict()) == ["weight"]
    with pytest.raises(ValueError, match="num_buckets must be >= 4"):
        RelativePositionBias(3, num_buckets=2)


def test_rotary_tables_follow_the_module_dtype() -> None:
    # A float64 module's tables are float64 too, so that the tabled rotation stays
    # bit-identical to the computed one.
    torch.manual_seed(3)
    rope = RotaryEmbedding(64, max_positions=2048).double()
    x = torch.randn(1, 2, 9, 64, dtype=torch.float64)
    assert rope.cos_table.dtype == torch.float64
    assert torch.equal(rope.rotate_from(x, 700), rope.rotate(x, torch.arange(700, 709)))
    back = rope.float()
    assert back.cos_table.dtype == torch.float32
    x32 = x.float()
    assert torch.equal(back.rotate_from(x32, 700), back.rotate(x32, torch.arange(700, 709)))


def test_modules_built_on_meta_compute_their_buffers_again() -> None:
    for make in (
        lambda: RotaryEmbedding(16, theta=1e5, max_positions=32),
        lambda: SinusoidalPositionalEncoding(16),
        lambda: ALiBi(6),
    ):
        with torch.device("meta"):
            module = make()
        assert all(b.is_meta for b in module.buffers())
        module.reset_buffers("cpu")
        expected = make()
        for (name, got), want in zip(module.named_buffers(), expected.buffers()):
            assert got.device.type == "cpu" and torch.equal(got, want), name
