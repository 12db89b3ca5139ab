"""Circuits of attention heads: each head's OV and QK matrices kept as factored products,
and the Q-, K- and V-composition scores between heads of different layers (Elhage et al.
2021, "A Mathematical Framework for Transformer Circuits").

A head's OV circuit ``W_V W_O`` (``[e, e]``, rank ``d``) says what it writes to the stream
for what it reads; its QK circuit ``W_Q W_Kᵀ`` (``[e, e]``) says which query and key
directions make it attend. Kept as factors (:class:`FactoredMatrix`), products with the
embedding and unembedding (``W_E @ OV @ W_U``) stay ``[v, d]`` and ``[d, v]`` factors,
never a vocabulary × vocabulary matrix.

The circuits read the raw projections: the norms before each block (their weights, and
for Qwen 3 and Gemma 3 the per-head query and key norms), the rotary encoding and the
score scale are not folded in, as in TransformerLens without ``fold_ln``.

Shape letters: ``L`` layers, ``h`` heads, ``e`` model dim, ``d`` head dim, ``v``
vocabulary, ``m``/``n`` rows and columns, ``r`` the inner dim of a factored matrix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from attnkit.models.model.lens import per_query_head


class FactoredMatrix:
    """The product ``A @ B`` kept as its factors ``A [..., m, r]`` and ``B [..., r, n]``
    (TransformerLens' ``FactoredMatrix``); leading dimensions (layers, heads) broadcast.

    Args:
        A: ``[..., m, r]``.
        B: ``[..., r, n]``.

    Raises:
        ValueError: factors whose inner dims differ, or with fewer than 2 dimensions.
    """

    def __init__(self, A: Tensor, B: Tensor) -> None:  # noqa: N803 (the factors' usual names)
        if A.ndim < 2 or B.ndim < 2 or A.shape[-1] != B.shape[-2]:
            raise ValueError(f"factors must be [..., m, r] and [..., r, n], got {list(A.shape)} and {list(B.shape)}")
        self.A, self.B = A, B

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={list(self.shape)}, inner={self.inner_dim})"

    @property
    def shape(self) -> torch.Size:
        """``[..., m, n]``: the leading dims broadcast from both factors."""
        lead = torch.broadcast_shapes(self.A.shape[:-2], self.B.shape[:-2])
        return torch.Size([*lead, self.A.shape[-2], self.B.shape[-1]])

    @property
    def inner_dim(self) -> int:
        """``r``."""
        return self.A.shape[-1]

    @property
    def AB(self) -> Tensor:  # noqa: N802
        """The product ``[..., m, n]``."""
        return self.A @ self.B

    @property
    def BA(self) -> Tensor:  # noqa: N802
        """``B @ A`` ``[..., r, r]``: it has the non-zero eigenvalues of ``A @ B``.

        Raises:
            ValueError: a matrix that is not square (``m != n``).
        """
        if self.A.shape[-2] != self.B.shape[-1]:
            raise ValueError(f"BA needs a square matrix, got {list(self.shape)}")
        return self.B @ self.A

    @property
    def T(self) -> FactoredMatrix:  # noqa: N802
        """The transpose ``Bᵀ Aᵀ``."""
        return FactoredMatrix(self.B.transpose(-1, -2), self.A.transpose(-1, -2))

    def svd(self) -> tuple[Tensor, Tensor, Tensor]:
        """The thin singular value decomposition without forming the product: QR of each
        factor, then the SVD of the small ``[r, r]`` middle.

        Returns:
            ``(U [..., m, r], S [..., r], V [..., n, r])`` with ``A @ B = U diag(S) Vᵀ``
            (TransformerLens' order: ``V``, not ``Vᵀ``), singular values descending.
        """
        q_a, r_a = torch.linalg.qr(self.A)  # [..., m, r], [..., r, r]
        q_b, r_b = torch.linalg.qr(self.B.transpose(-1, -2))  # [..., n, r], [..., r, r]
        u, s, vh = torch.linalg.svd(r_a @ r_b.transpose(-1, -2))  # [..., r, r], [..., r], [..., r, r]
        return q_a @ u, s, q_b @ vh.transpose(-1, -2)

    @property
    def S(self) -> Tensor:  # noqa: N802
        """The singular values ``[..., r]``, descending."""
        return self.svd()[1]

    @property
    def eigenvalues(self) -> Tensor:
        """The eigenvalues of ``B @ A`` ``[..., r]`` (complex): the non-zero ones of the
        square ``A @ B``."""
        return torch.linalg.eigvals(self.BA)

    def norm(self) -> Tensor:
        """The Frobenius norm ``[...]``, from the singular values."""
        return self.S.pow(2).sum(-1).sqrt()

    def __getitem__(self, index: int | slice | tuple[int | slice, ...]) -> FactoredMatrix:
        """Index the leading dimensions (``ov[3, 5]``: layer 3, head 5)."""
        index = index if isinstance(index, tuple) else (index,)
        lead = self.shape[:-2]
        if len(index) > len(lead):
            raise IndexError(f"a factored matrix of shape {list(self.shape)} has {len(lead)} leading dims")
        a = self.A.expand(*lead, *self.A.shape[-2:])
        b = self.B.expand(*lead, *self.B.shape[-2:])
        return FactoredMatrix(a[index], b[index])

    def __matmul__(self, other: Tensor | FactoredMatrix) -> FactoredMatrix:
        """``self @ other``, still factored (the inner dim stays the smaller one)."""
        if isinstance(other, FactoredMatrix):
            middle = self.B @ other.A  # [..., r, r']
            if self.inner_dim <= other.inner_dim:
                return FactoredMatrix(self.A, middle @ other.B)
            return FactoredMatrix(self.A @ middle, other.B)
        return FactoredMatrix(self.A, self.B @ other)

    def __rmatmul__(self, other: Tensor) -> FactoredMatrix:
        """``other @ self``, still factored."""
        return FactoredMatrix(other @ self.A, self.B)


class _Weights(Protocol):
    """What the circuits read of a model: TransformerLens' weights
    (:class:`attnkit.models.model.lens.LensMixin`)."""

    @property
    def num_heads(self) -> int: ...

    @property
    def W_Q(self) -> Tensor: ...  # noqa: N802

    @property
    def W_K(self) -> Tensor: ...  # noqa: N802

    @property
    def W_V(self) -> Tensor: ...  # noqa: N802

    @property
    def W_O(self) -> Tensor: ...  # noqa: N802


def ov_circuit(model: _Weights) -> FactoredMatrix:
    """Every head's OV circuit ``W_V W_O``, ``[L, h, e, e]`` factored (TransformerLens'
    ``model.OV``); with grouped-query attention each query head uses its key/value head's
    ``W_V``."""
    return FactoredMatrix(per_query_head(model.W_V, model.num_heads), model.W_O)


def qk_circuit(model: _Weights) -> FactoredMatrix:
    """Every head's QK circuit ``W_Q W_Kᵀ``, ``[L, h, e, e]`` factored (TransformerLens'
    ``model.QK``): a query stream ``x_q`` and a key stream ``x_k`` score ``x_q QK x_kᵀ``
    (before the rotary encoding and the scale)."""
    return FactoredMatrix(model.W_Q, per_query_head(model.W_K, model.num_heads).transpose(-1, -2))


@dataclass(frozen=True)
class CompositionScores:
    """How much each head's input reads what earlier heads wrote.

    Attributes:
        kind: ``"q"``, ``"k"`` or ``"v"``.
        scores: ``[L, h, L, h]``: ``scores[l1, h1, l2, h2]`` for a writer ``(l1, h1)`` and
            a reader ``(l2, h2)`` with ``l1 < l2``; ``0`` where ``l1 >= l2``.
        baseline: the score of random matrices of the same shapes (about ``1/√e`` for
            rank-``d`` factors): what a score should clearly exceed to mean composition.
    """

    kind: str
    scores: Tensor
    baseline: float


def composition_scores(
    model: _Weights, kind: Literal["q", "k", "v"], *, layers: Sequence[int] | None = None
) -> CompositionScores:
    """Q-, K- or V-composition scores between every pair of heads (Elhage et al. 2021):
    ``‖W_OV¹ · M²‖_F / (‖W_OV¹‖_F ‖M²‖_F)`` with ``M²`` the reader's ``W_QK`` (Q), its
    ``W_QKᵀ`` (K) or its ``W_OV`` (V), as TransformerLens' ``all_composition_scores``.

    Computed from the factors' QR decompositions: every norm is that of a ``[d, d]``
    matrix, never of an ``[e, e]`` one.

    Args:
        model: a model with TransformerLens' weights.
        kind: ``"q"``, ``"k"`` or ``"v"``.
        layers: the layers to score (default all); scores between other layers are 0.

    Returns:
        A :class:`CompositionScores`.

    Raises:
        ValueError: an unknown ``kind``.
    """
    if kind not in ("q", "k", "v"):
        raise ValueError(f'kind must be "q", "k" or "v", got {kind!r}')
    ov = ov_circuit(model)
    reader = {"q": qk_circuit(model), "k": qk_circuit(model).T, "v": ov}[kind]
    num_layers, h, e = ov.shape[0], ov.shape[1], ov.shape[-1]
    chosen = range(num_layers) if layers is None else sorted(set(layers))
    # ‖A1 B1 A2 B2‖ = ‖R_a1 (B1 A2) R_b2ᵀ‖ with A1 = Q_a1 R_a1 and B2ᵀ = Q_b2 R_b2.
    _, r_writer = torch.linalg.qr(ov.A.float())  # [L, h, d, d]
    _, r_reader = torch.linalg.qr(reader.B.float().transpose(-1, -2))  # [L, h, d, d]
    writer_norm, reader_norm = ov.norm().float(), reader.norm().float()  # [L, h] each
    scores = torch.zeros(num_layers, h, num_layers, h)
    for l2 in chosen:
        for l1 in (layer for layer in chosen if layer < l2):
            middle = ov.B[l1].float()[:, None] @ reader.A[l2].float()[None]  # [h1, h2, d, d]
            inner = r_writer[l1][:, None] @ middle @ r_reader[l2][None].transpose(-1, -2)  # [h1, h2, d, d]
            norms = torch.linalg.matrix_norm(inner)  # [h1, h2]
            scores[l1, :, l2, :] = norms / (writer_norm[l1][:, None] * reader_norm[l2][None])
    return CompositionScores(kind=kind, scores=scores, baseline=_random_baseline(e, ov.inner_dim))


def _random_baseline(e: int, d: int, samples: int = 8) -> float:
    """The mean composition score of random Gaussian rank-``d`` ``[e, e]`` factor pairs."""
    generator = torch.Generator().manual_seed(0)
    total = 0.0
    for _ in range(samples):
        a, b, c, f = (torch.randn(e, d, generator=generator) for _ in range(4))
        first, second = FactoredMatrix(a, b.T), FactoredMatrix(c, f.T)
        total += float((first @ second).norm() / (first.norm() * second.norm()))
    return total / samples
