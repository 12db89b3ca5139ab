"""Positional encodings: the ways a Transformer learns where each token is.

Shape letters: ``b`` batch, ``h`` heads, ``s`` sequence length, ``s_q`` query length,
``s_k`` key length, ``d`` head dim, ``e`` model dim.

Attention by itself is blind to order (permuting the tokens permutes the output), so
position has to come in from somewhere. Two families:

- **Absolute, added to the embeddings** before the first layer:
  :class:`SinusoidalPositionalEncoding` (the paper's fixed sin/cos table) and
  :class:`LearnedPositionalEmbedding` (BERT, GPT-2).
- **Inside attention**, subclasses of :class:`AttentionPositional` handed to
  :class:`attnkit.nn.MultiHeadAttention` as ``positional=``: :class:`RotaryEmbedding`
  rotates queries and keys (LLaMA), :class:`ALiBi` and :class:`RelativePositionBias` (T5)
  add a bias to the scores. These depend only on the distance between query and key.

Positions of queries are absolute: with ``s_q < s_k`` (decoding with a KV cache) query row
``i`` sits at position ``i + s_k - s_q``, as in :mod:`attnkit.masks`.

Non-weight tensors (frequency tables, slopes) are buffers with ``persistent=False``: they
are rebuilt from the constructor's arguments and never appear in a ``state_dict``.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.nn.rope_scaling import RopeScaling, rotary_frequencies


def _check_positions(positions: Tensor, seq_len: int, what: str) -> None:
    """``positions`` must be integer ``[s]`` or ``[b, s]`` with ``s == seq_len``.

    Values are not checked here: that would synchronise with the device on every call, and
    sines and rotations are defined for any integer.
    """
    if positions.dtype.is_floating_point or positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions must be an integer tensor, got dtype {positions.dtype}")
    if positions.ndim not in (1, 2) or positions.shape[-1] != seq_len:
        raise ValueError(
            f"positions must be [s] or [b, s] with s = {seq_len} (the length of {what}), "
            f"got shape {list(positions.shape)}"
        )


def _check_tokens(x: Tensor, embed_dim: int) -> None:
    if x.ndim != 3 or x.shape[-1] != embed_dim:
        raise ValueError(f"expected x of shape [b, s, e] with e = {embed_dim}, got {list(x.shape)}")


# ---------------------------------------------------------------------------------------
# Absolute encodings, added to the token embeddings.
# ---------------------------------------------------------------------------------------


class SinusoidalPositionalEncoding(nn.Module):
    """The fixed encoding of "Attention Is All You Need":
    ``PE(pos, 2i) = sin(pos / base^(2i/e))`` and ``PE(pos, 2i+1) = cos(pos / base^(2i/e))``.

    Low dimensions turn fast (dimension 0 has period 2π), high ones slowly (period up to
    ``2π·base``), so nearby positions get similar vectors and far ones different vectors.
    Nothing is learned, and any position can be encoded, longer than any seen in training.

    Args:
        embed_dim: ``e``, even.
        base: the ``10000`` of the formula.

    Raises:
        ValueError: ``embed_dim`` odd or < 2, ``base <= 1``.
    """

    def __init__(self, embed_dim: int, *, base: float = 10000.0) -> None:
        super().__init__()
        if embed_dim < 2 or embed_dim % 2:
            raise ValueError(f"embed_dim must be even and >= 2 (sin/cos pairs), got {embed_dim}")
        if base <= 1:
            raise ValueError(f"base must be > 1, got {base}")
        self.embed_dim = embed_dim
        self.base = base
        # Kept as a buffer so it follows .to(device); computed from the arguments, so it
        # stays out of the state_dict.
        self.register_buffer("denominators", None, persistent=False)
        self.reset_buffers()

    def reset_buffers(self, device: torch.device | str | None = None) -> None:
        """Compute the buffers from the arguments again (float32), on ``device`` (default:
        the current default device): for a module built on the ``meta`` device."""
        computed_on, kept_on = _buffer_devices(device)
        two_i = torch.arange(0, self.embed_dim, 2, dtype=torch.float32, device=computed_on)  # [e/2]
        self.denominators = (self.base ** (two_i / self.embed_dim)).to(kept_on)

    def encodings(self, positions: Tensor) -> Tensor:
        """The encoding of each position.

        Args:
            positions: integer ``[s]`` or ``[b, s]``.

        Returns:
            float32 ``[s, e]`` or ``[b, s, e]``; entry ``2i`` is the sine, ``2i+1`` the cosine.
        """
        _check_positions(positions, positions.shape[-1], "positions")
        angles = positions.to(self.denominators.dtype).unsqueeze(-1) / self.denominators  # [..., s, e/2]
        # Interleave: [sin_0, cos_0, sin_1, cos_1, ...].
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # [..., s, e]

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Add the encodings to token embeddings.

        Args:
            x: ``[b, s, e]``.
            positions: integer ``[s]`` or ``[b, s]``; default ``0 .. s-1``.

        Returns:
            ``x + PE``, ``[b, s, e]``, in the dtype of ``x``.

        Raises:
            ValueError: ``x`` is not ``[b, s, e]``, or ``positions`` does not fit it.
        """
        _check_tokens(x, self.embed_dim)
        if positions is None:
            positions = torch.arange(x.shape[1], device=x.device)
        _check_positions(positions, x.shape[1], "x")
        return x + self.encodings(positions).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.embed_dim}, base={self.base}"


class LearnedPositionalEmbedding(nn.Module):
    """One learned vector per position, up to ``max_length`` (BERT, GPT-2).

    Args:
        max_length: number of positions that have a vector.
        embed_dim: ``e``.

    Raises:
        ValueError: non-positive sizes.
    """

    def __init__(self, max_length: int, embed_dim: int) -> None:
        super().__init__()
        if max_length < 1 or embed_dim < 1:
            raise ValueError(f"max_length and embed_dim must be >= 1, got {max_length} and {embed_dim}")
        self.max_length = max_length
        self.embed_dim = embed_dim
        # BERT and GPT-2 initialise position vectors with std 0.02.
        self.weight = nn.Parameter(torch.empty(max_length, embed_dim))
        nn.init.normal_(self.weight, std=0.02)

    def encodings(self, positions: Tensor) -> Tensor:
        """The learned vector of each position.

        Args:
            positions: integer ``[s]`` or ``[b, s]``.

        Returns:
            ``[s, e]`` or ``[b, s, e]``.

        Raises:
            ValueError: a position outside ``[0, max_length)``.
        """
        _check_positions(positions, positions.shape[-1], "positions")
        if positions.numel() and (positions.min() < 0 or positions.max() >= self.max_length):
            raise ValueError(
                f"positions must be in [0, {self.max_length}) for this learned embedding, got "
                f"[{positions.min().item()}, {positions.max().item()}]"
            )
        return F.embedding(positions, self.weight)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Add the position vectors to token embeddings.

        Args:
            x: ``[b, s, e]``.
            positions: integer ``[s]`` or ``[b, s]``; default ``0 .. s-1``.

        Returns:
            ``[b, s, e]``.

        Raises:
            ValueError: shapes do not fit, or a position is beyond ``max_length``.
        """
        _check_tokens(x, self.embed_dim)
        if positions is None:
            positions = torch.arange(x.shape[1], device=x.device)
        _check_positions(positions, x.shape[1], "x")
        return x + self.encodings(positions)

    def extra_repr(self) -> str:
        return f"{self.max_length}, {self.embed_dim}"


# ---------------------------------------------------------------------------------------
# Encodings that act inside attention.
# ---------------------------------------------------------------------------------------


class AttentionPositional(nn.Module):
    """Base of the positional encodings that :class:`attnkit.nn.MultiHeadAttention`
    applies itself. Each subclass overrides one hook; the other stays a no-op.

    Attributes:
        num_heads: the number of query heads the encoding was built for, or ``None`` when
            it works with any number.
        head_dim: the head dim it was built for, or ``None`` when it works with any.
        takes_positions: whether the encoding rotates queries and keys at their token
            positions (:meth:`rotate`; rotary). The others leave queries and keys as they
            are and add :meth:`score_bias`, which uses the row/column index, aligned
            bottom-right like masks.
    """

    num_heads: int | None = None
    head_dim: int | None = None
    takes_positions: ClassVar[bool] = False

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Transform queries or keys ``[b, h, s, d]`` at ``positions`` (``[s]`` or ``[b, s]``)."""
        return x

    def rotate_from(self, x: Tensor, start: int) -> Tensor:
        """:meth:`rotate` at the consecutive positions ``start .. start + s - 1``: the usual
        case (a whole text, or the next tokens after a KV cache), which an encoding may serve
        faster than arbitrary positions."""
        return self.rotate(x, torch.arange(start, start + x.shape[2], device=x.device))

    def score_bias(self, s_q: int, s_k: int, *, device: torch.device, dtype: torch.dtype) -> Tensor | None:
        """An additive score bias ``[1, h, s_q, s_k]``, or ``None``."""
        return None


class RotaryEmbedding(AttentionPositional):
    """Rotary position embedding, RoPE (Su et al., 2021), in the half-split layout of
    LLaMA checkpoints.

    Dimension ``j`` of the first half and ``j + r/2`` of the second form a pair, rotated by
    the angle ``pos · θ^(-2j/r)``, where ``r`` is the number of rotated dims (``d`` unless
    the rotation is partial). Rotating both q (at position m) and k (at n) makes ``q·k``
    depend on ``m - n`` only: absolute positions in, relative attention out.

    Args:
        head_dim: ``d``, even; the dimension of one query/key head.
        theta: the base of the frequencies (10000 in the paper, 1e5 in SmolLM2).
        max_positions: precompute the cosines and sines of positions ``0 ..
            max_positions - 1`` once, so that :meth:`rotate_from` (every layer, every
            decoding step) slices a table instead of evaluating ``cos``/``sin`` again. The
            results are bit-identical; positions beyond it are computed on the fly.
        rotary_dim: ``r``, rotate only the first ``r`` dims of each head and pass the others
            through unchanged (partial rotary, GPT-NeoX's ``rotary_pct``); default ``d``.
        scaling: an :class:`attnkit.nn.rope_scaling.RopeScaling` that changes the
            frequencies for longer contexts (linear, Llama 3, dynamic NTK); default none.

    Raises:
        ValueError: ``head_dim`` or ``rotary_dim`` odd or < 2, ``rotary_dim > head_dim``,
            ``theta <= 1``, ``max_positions < 1``.
        TypeError: a ``scaling`` that is not a ``RopeScaling``.
    """

    takes_positions: ClassVar[bool] = True
    head_dim: int

    def __init__(
        self,
        head_dim: int,
        *,
        theta: float = 10000.0,
        max_positions: int | None = None,
        rotary_dim: int | None = None,
        scaling: RopeScaling | None = None,
    ) -> None:
        super().__init__()
        if head_dim < 2 or head_dim % 2:
            raise ValueError(f"head_dim must be even and >= 2 (rotation pairs), got {head_dim}")
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(f"rotary_dim must be even, >= 2 and at most head_dim={head_dim}, got {rotary_dim}")
        if theta <= 1:
            raise ValueError(f"theta must be > 1, got {theta}")
        if max_positions is not None and max_positions < 1:
            raise ValueError(f"max_positions must be >= 1, got {max_positions}")
        if scaling is not None and not isinstance(scaling, RopeScaling):
            raise TypeError(f"scaling must be an attnkit.nn.rope_scaling.RopeScaling, got {type(scaling).__name__}")
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.theta = theta
        self.max_positions = max_positions
        self.scaling = scaling
        for name in ("inv_freq", "half_signs", "cos_table", "signed_sin_table"):
            self.register_buffer(name, None, persistent=False)
        self.cos_table: Tensor | None
        self.signed_sin_table: Tensor | None
        self.reset_buffers()

    def reset_buffers(self, device: torch.device | str | None = None) -> None:
        """Compute the frequencies and tables from the arguments again (float32), on
        ``device`` (default: the current default device): for a module built on the
        ``meta`` device."""
        computed_on, kept_on = _buffer_devices(device)
        with torch.device(computed_on):
            self.inv_freq = self._frequencies()  # [r/2]
            # Rotation as x * cos + swap_halves(x) * signed_sin, with the sign of the first half
            # folded into the table: (-a) * b == a * (-b) exactly, and it saves a negation pass.
            half = torch.ones(self.rotary_dim // 2)
            self.half_signs = torch.cat((-half, half))  # [r]
        if kept_on.type == "meta":
            # Tables of no values: rotations compute on the fly until the buffers are reset
            # on a real device.
            self.cos_table = self.signed_sin_table = None
            self.inv_freq, self.half_signs = self.inv_freq.to(kept_on), self.half_signs.to(kept_on)
        else:
            self._fill_tables()

    def _frequencies(self, length: int | None = None) -> Tensor:
        """The frequencies (float32 ``[r/2]``) for positions below ``length`` (``None``: the
        ones that hold up to the scaling's ``max_positions``)."""
        if self.scaling is None:
            return rotary_frequencies(self.rotary_dim, self.theta)
        return self.scaling.frequencies(self.theta, self.rotary_dim, length)

    def _frequencies_for(self, end: int) -> Tensor | None:
        """Frequencies other than :attr:`inv_freq` for a call reaching position ``end - 1``
        (dynamic scaling past its ``max_positions``), or ``None``."""
        scaling = self.scaling
        if scaling is None or not scaling.varies_with_length or end <= (scaling.max_positions or 0):
            return None
        return self._frequencies(end).to(self.inv_freq)

    def _table_rows(self) -> int:
        """The positions the cosine and sine tables hold (0 without ``max_positions``)."""
        if self.max_positions is None:
            return 0
        rows = self.max_positions
        if self.scaling is not None and self.scaling.varies_with_length:
            rows = min(rows, self.scaling.max_positions or rows)  # past it the frequencies change
        return rows

    def buffer_bytes(self) -> int:
        """The bytes :meth:`reset_buffers` makes on a real device (float32 frequencies,
        signs and the two ``[rows, r]`` tables): what a load counts before building them."""
        return 4 * (self.rotary_dim // 2 + self.rotary_dim + 2 * self._table_rows() * self.rotary_dim)

    def _fill_tables(self) -> None:
        """Compute the cosine and sine tables from the frequencies, in their dtype and on
        their device: the tables then hold exactly what :meth:`rotate` computes."""
        rows = self._table_rows()
        if rows == 0:
            return
        positions = torch.arange(rows, device=self.inv_freq.device)
        cos, sin = self.cos_sin(positions)  # [rows, r] each
        self.cos_table, self.signed_sin_table = cos, sin * self.half_signs

    def _apply(self, fn, recurse=True):  # torch.nn.Module's signature
        # A dtype change (``.double()``, ``.to(float64)``) would only cast the float32
        # tables; they are computed again from the cast frequencies instead. Half-precision
        # angles would be wrong by whole radians at long positions: the frequencies stay
        # float32 then, as in Hugging Face's LLaMA.
        before = (self.inv_freq.dtype, self.inv_freq.device)
        out = super()._apply(fn, recurse)
        if self.inv_freq.dtype.itemsize < 4:
            self.inv_freq = self._frequencies().to(self.inv_freq.device)
        now = (self.inv_freq.dtype, self.inv_freq.device)
        table = self.cos_table
        if table is not None and now[1].type != "meta" and (now != before or (table.dtype, table.device) != now):
            self._fill_tables()
        return out

    def cos_sin(self, positions: Tensor, frequencies: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Cosines and sines of every angle, in the dtype of the frequencies (float32, or
        float64 in a module made float64).

        Args:
            positions: integer ``[s]`` or ``[b, s]``.
            frequencies: ``[r/2]``, default :attr:`inv_freq`.

        Returns:
            ``(cos, sin)``, each ``[s, r]`` or ``[b, s, r]`` (the ``r/2`` angles repeated
            for both halves).
        """
        inv_freq = self.inv_freq if frequencies is None else frequencies
        angles = positions.float().unsqueeze(-1) * inv_freq  # [..., s, r/2]
        angles = torch.cat((angles, angles), dim=-1)  # [..., s, r]
        return angles.cos(), angles.sin()

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate queries or keys.

        Args:
            x: ``[b, h, s, d]``.
            positions: integer ``[s]`` or ``[b, s]``.

        Returns:
            ``[b, h, s, d]``, the dtype of ``x``.

        Raises:
            ValueError: ``x`` has the wrong head dim, or ``positions`` does not fit it.
        """
        self._check_x(x)
        _check_positions(positions, x.shape[2], "x")
        frequencies = None
        if self.scaling is not None and self.scaling.varies_with_length and positions.numel():
            frequencies = self._frequencies_for(int(positions.max()) + 1)
        cos, sin = self.cos_sin(positions, frequencies)
        if positions.ndim == 2:
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [b, 1, s, d]: the same for every head
        return self._rotate(x, cos, sin * self.half_signs)

    def rotate_from(self, x: Tensor, start: int) -> Tensor:
        """Rotate queries or keys at positions ``start .. start + s - 1``, from the
        precomputed tables when they reach that far.

        Args:
            x: ``[b, h, s, d]``.
            start: the position of the first of the ``s`` tokens.

        Returns:
            ``[b, h, s, d]``, the dtype of ``x``.

        Raises:
            ValueError: ``x`` has the wrong head dim.
        """
        end = start + x.shape[2]
        cos_table, signed_sin_table = self.cos_table, self.signed_sin_table
        if cos_table is None or signed_sin_table is None or end > cos_table.shape[0]:
            return self.rotate(x, torch.arange(start, end, device=x.device))
        self._check_x(x)
        return self._rotate(x, cos_table[start:end], signed_sin_table[start:end])  # tables: [s, r] views

    def _rotate(self, x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
        if self.rotary_dim < self.head_dim:
            rotated = _rotate_pairs(x[..., : self.rotary_dim], cos, signed_sin)  # [b, h, s, r]
            return torch.cat((rotated, x[..., self.rotary_dim :]), dim=-1)  # [b, h, s, d]
        return _rotate_pairs(x, cos, signed_sin)

    def _check_x(self, x: Tensor) -> None:
        if x.ndim != 4 or x.shape[-1] != self.head_dim:
            raise ValueError(f"expected x [b, h, s, d] with d = {self.head_dim}, got {list(x.shape)}")

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """:meth:`rotate` with positions ``0 .. s-1`` by default."""
        if positions is None:
            return self.rotate_from(x, 0)
        return self.rotate(x, positions)

    def extra_repr(self) -> str:
        table = "" if self.max_positions is None else f", max_positions={self.max_positions}"
        partial = "" if self.rotary_dim == self.head_dim else f", rotary_dim={self.rotary_dim}"
        scaling = "" if self.scaling is None else f", scaling={self.scaling}"
        return f"head_dim={self.head_dim}, theta={self.theta}{partial}{table}{scaling}"


def _rotate_pairs(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """``x * cos + swap_halves(x) * signed_sin`` over the last dim ``r`` of ``x [..., r]``."""
    # Rolling by half the width swaps the halves (one op instead of two slices and a cat).
    swapped = x.roll(x.shape[-1] // 2, dims=-1)  # [..., r]
    if cos.dtype != x.dtype:  # a cast that changes nothing still costs a call per layer and step
        cos, signed_sin = cos.to(x.dtype), signed_sin.to(x.dtype)
    return x * cos + swapped * signed_sin


def _buffer_devices(device: torch.device | str | None) -> tuple[torch.device, torch.device]:
    """Where to compute a module's buffers, and where to keep them: on ``device`` (default:
    the current default device). A module built on ``meta`` (for weights a checkpoint
    replaces) computes them on the CPU: arithmetic on meta tensors is not free (torch's meta
    kernels import its compiler on first use, about 2 s on two cores), and these tables are
    small."""
    kept_on = torch.device(device) if device is not None else torch.get_default_device()
    return (torch.device("cpu") if kept_on.type == "meta" else kept_on), kept_on


def alibi_slopes(num_heads: int) -> list[float]:
    """The head slopes of ALiBi (Press et al., 2022).

    For ``n`` a power of two: the geometric sequence starting at and with ratio
    ``2^(-8/n)`` (for 8 heads: 1/2, 1/4, ..., 1/256). Otherwise the slopes of the nearest
    smaller power of two ``m``, followed by every other slope of ``2m``.

    Raises:
        ValueError: ``num_heads < 1``.
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


class ALiBi(AttentionPositional):
    """Attention with Linear Biases: head ``h`` adds ``-slope_h · |i - j|`` to the score of
    query position ``i`` and key position ``j``. No position enters the embeddings.

    For causal attention this is the paper's bias exactly (``j <= i``); the absolute value
    extends it symmetrically for bidirectional attention.

    Args:
        num_heads: number of query heads ``h``.

    Raises:
        ValueError: ``num_heads < 1``.
    """

    num_heads: int

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.register_buffer("slopes", None, persistent=False)
        self.reset_buffers()

    def reset_buffers(self, device: torch.device | str | None = None) -> None:
        """Compute the slopes again (float32), on ``device`` (default: the current default
        device): for a module built on the ``meta`` device."""
        self.slopes = torch.tensor(alibi_slopes(self.num_heads), device=device)  # [h]

    def score_bias(self, s_q: int, s_k: int, *, device: torch.device, dtype: torch.dtype) -> Tensor:
        """The bias ``[1, h, s_q, s_k]``; query row ``i`` is at position ``i + s_k - s_q``."""
        q_pos = torch.arange(s_q, device=device).unsqueeze(1) + (s_k - s_q)  # [s_q, 1]
        k_pos = torch.arange(s_k, device=device).unsqueeze(0)  # [1, s_k]
        distance = (q_pos - k_pos).abs().to(dtype)  # [s_q, s_k]
        return -self.slopes.to(device=device, dtype=dtype).view(1, -1, 1, 1) * distance  # [1, h, s_q, s_k]

    def forward(self, s_q: int, s_k: int) -> Tensor:
        """:meth:`score_bias` on the slopes' device, float32."""
        return self.score_bias(s_q, s_k, device=self.slopes.device, dtype=torch.float32)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"


def relative_position_bucket(
    relative_position: Tensor, *, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """T5's bucket of each relative position ``key - query``.

    Half the buckets (of each direction, when ``bidirectional``) hold the small distances
    exactly; the rest cover distances up to ``max_distance`` on a log scale, and everything
    farther shares the last bucket. Unidirectional buckets only tell apart keys in the past
    (future keys all land in bucket 0, which a causal mask hides anyway).

    Args:
        relative_position: integer tensor of ``key_pos - query_pos``, any shape.
        bidirectional: give positive and negative offsets separate buckets.
        num_buckets: total number of buckets.
        max_distance: distance from which everything shares the last bucket.

    Returns:
        Long tensor of bucket indices in ``[0, num_buckets)``, the shape of the input.
    """
    buckets = torch.zeros_like(relative_position, dtype=torch.long)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    # Clamp before the log: the small distances take the exact branch of where(), but log(0)
    # would still be evaluated for them.
    log_ratio = torch.log(distance.clamp(min=max_exact).float() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + log_ratio * (num_buckets - max_exact)).long().clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < max_exact, distance, large)


class RelativePositionBias(AttentionPositional):
    """T5's learned relative position bias: one learned scalar per head and bucket of
    ``key - query`` offset, added to the scores.

    T5 computes it once in the first layer and shares it with every layer; do the same by
    passing one instance to every layer's attention. T5 also leaves the scores unscaled:
    use it with ``score="dot"``.

    Args:
        num_heads: number of query heads ``h``.
        num_buckets: number of buckets (T5: 32).
        max_distance: distance from which offsets share a bucket (T5: 128).
        bidirectional: ``True`` for an encoder, ``False`` for a causal decoder.

    Raises:
        ValueError: sizes that leave no exact bucket, or ``max_distance`` not beyond them.
    """

    def __init__(
        self, num_heads: int, *, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True
    ) -> None:
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {num_heads}")
        exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
        if exact < 1:
            raise ValueError(
                f"num_buckets must be >= {4 if bidirectional else 2} (bidirectional={bidirectional}), got {num_buckets}"
            )
        if max_distance <= exact:
            raise ValueError(f"max_distance must be > {exact} (the exact buckets), got {max_distance}")
        self.num_heads = num_heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.weight = nn.Parameter(torch.empty(num_buckets, num_heads))  # [buckets, h]
        nn.init.normal_(self.weight, std=0.02)
        self.register_buffer("offset_buckets", None, persistent=False)
        self.reset_buffers()

    def reset_buffers(self, device: torch.device | str | None = None) -> None:
        """The bucket of every offset from ``-max_distance`` to ``max_distance`` (beyond them
        the buckets no longer change), on ``device``: for a module built on the ``meta``
        device. Looking offsets up in this table costs a decoding step one gather instead
        of the logarithms of :func:`relative_position_bucket`."""
        computed_on, kept_on = _buffer_devices(device)
        offsets = torch.arange(-self.max_distance, self.max_distance + 1, device=computed_on)  # [2 m + 1]
        self.offset_buckets = relative_position_bucket(
            offsets, bidirectional=self.bidirectional, num_buckets=self.num_buckets, max_distance=self.max_distance
        ).to(kept_on)

    def score_bias(self, s_q: int, s_k: int, *, device: torch.device, dtype: torch.dtype) -> Tensor:
        """The bias ``[1, h, s_q, s_k]``; query row ``i`` is at position ``i + s_k - s_q``."""
        q_pos = torch.arange(s_q, device=device).unsqueeze(1) + (s_k - s_q)  # [s_q, 1]
        k_pos = torch.arange(s_k, device=device).unsqueeze(0)  # [1, s_k]
        offsets = (k_pos - q_pos).clamp(-self.max_distance, self.max_distance) + self.max_distance  # [s_q, s_k]
        buckets = self.offset_buckets.to(device)[offsets]  # [s_q, s_k]
        bias = F.embedding(buckets, self.weight)  # [s_q, s_k, h]
        return bias.permute(2, 0, 1).unsqueeze(0).to(dtype)  # [1, h, s_q, s_k]

    def forward(self, s_q: int, s_k: int) -> Tensor:
        """:meth:`score_bias` in the weight's device and dtype."""
        return self.score_bias(s_q, s_k, device=self.weight.device, dtype=self.weight.dtype)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )
