"""FactoredMatrix, OV/QK circuits and composition scores against dense computations."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attnkit.inspect.circuits import FactoredMatrix, composition_scores, ov_circuit, qk_circuit

ATOL = 1e-9


def _random(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64)


@pytest.fixture
def factored() -> FactoredMatrix:
    torch.manual_seed(0)
    return FactoredMatrix(_random(3, 2, 12, 4), _random(3, 2, 4, 12))


def test_product_transpose_and_indexing(factored):
    dense = factored.A @ factored.B
    assert factored.shape == (3, 2, 12, 12) and factored.inner_dim == 4
    assert torch.allclose(factored.AB, dense, atol=ATOL)
    assert torch.allclose(factored.BA, factored.B @ factored.A, atol=ATOL)
    assert torch.allclose(factored.T.AB, dense.transpose(-1, -2), atol=ATOL)
    assert torch.allclose(factored[1, 0].AB, dense[1, 0], atol=ATOL)
    assert torch.allclose(factored[2].AB, dense[2], atol=ATOL)
    with pytest.raises(IndexError):
        factored[0, 0, 0]
    with pytest.raises(ValueError, match="factors must be"):
        FactoredMatrix(_random(3, 4), _random(5, 3))
    with pytest.raises(ValueError, match="square"):
        _ = FactoredMatrix(_random(3, 2), _random(2, 5)).BA


def test_svd_eigenvalues_and_norm_equal_the_dense_ones(factored):
    dense = factored.AB
    u, s, v = factored.svd()
    assert u.shape == (3, 2, 12, 4) and s.shape == (3, 2, 4) and v.shape == (3, 2, 12, 4)
    assert torch.allclose(u @ torch.diag_embed(s) @ v.transpose(-1, -2), dense, atol=1e-8)
    assert torch.allclose(s, torch.linalg.svdvals(dense)[..., :4], atol=1e-8)
    assert torch.allclose(factored.norm(), torch.linalg.matrix_norm(dense), atol=1e-8)
    # The 4 non-zero eigenvalues of the 12 x 12 product.
    dense_eigenvalues = torch.linalg.eigvals(dense[0, 0])
    largest = dense_eigenvalues[dense_eigenvalues.abs().argsort(descending=True)[:4]]
    ours = factored.eigenvalues[0, 0]
    for value in ours:
        assert (largest - value).abs().min() < 1e-8


def test_products_stay_factored(factored):
    embed, unembed = _random(50, 12), _random(12, 60)  # [v, e], [e, v']
    circuit = embed @ factored[0, 1] @ unembed
    assert isinstance(circuit, FactoredMatrix) and circuit.A.shape == (50, 4) and circuit.B.shape == (4, 60)
    assert torch.allclose(circuit.AB, embed @ factored.AB[0, 1] @ unembed, atol=1e-8)
    other = FactoredMatrix(_random(12, 2), _random(2, 12))
    both = factored[0, 0] @ other
    assert both.inner_dim == 2
    assert torch.allclose(both.AB, factored.AB[0, 0] @ other.AB, atol=1e-8)
    assert torch.allclose((other @ factored[0, 0]).AB, other.AB @ factored.AB[0, 0], atol=1e-8)


def _weights(num_layers: int = 3, h: int = 4, h_kv: int = 2, e: int = 16, d: int = 4) -> SimpleNamespace:
    torch.manual_seed(1)
    return SimpleNamespace(
        num_heads=h,
        W_Q=_random(num_layers, h, e, d),
        W_K=_random(num_layers, h_kv, e, d),
        W_V=_random(num_layers, h_kv, e, d),
        W_O=_random(num_layers, h, d, e),
    )


def test_circuits_of_grouped_query_heads():
    weights = _weights()
    ov, qk = ov_circuit(weights), qk_circuit(weights)
    assert ov.shape == (3, 4, 16, 16) and qk.shape == (3, 4, 16, 16)
    assert torch.allclose(ov[1, 3].AB, weights.W_V[1, 1] @ weights.W_O[1, 3], atol=ATOL)
    assert torch.allclose(qk[2, 0].AB, weights.W_Q[2, 0] @ weights.W_K[2, 0].T, atol=ATOL)


@pytest.mark.parametrize("kind", ["q", "k", "v"])
def test_composition_scores_equal_the_dense_definition(kind):
    weights = _weights()
    result = composition_scores(weights, kind)
    ov = weights.W_V.repeat_interleave(2, 1) @ weights.W_O  # [L, h, e, e]
    qk = weights.W_Q @ weights.W_K.repeat_interleave(2, 1).transpose(-1, -2)  # [L, h, e, e]
    reader = {"q": qk, "k": qk.transpose(-1, -2), "v": ov}[kind]
    for l1 in range(3):
        for l2 in range(3):
            for h1 in range(4):
                for h2 in range(4):
                    got = float(result.scores[l1, h1, l2, h2])
                    if l1 >= l2:
                        assert got == 0
                        continue
                    left, right = ov[l1, h1], reader[l2, h2]
                    expected = torch.linalg.matrix_norm(left @ right) / (
                        torch.linalg.matrix_norm(left) * torch.linalg.matrix_norm(right)
                    )
                    assert abs(got - float(expected)) < 1e-5, (l1, h1, l2, h2)
    assert 0 < result.baseline < 1
    only = composition_scores(weights, kind, layers=[0, 2])
    assert torch.equal(only.scores[0, :, 2], result.scores[0, :, 2]) and not only.scores[0, :, 1].any()
    with pytest.raises(ValueError, match="kind must be"):
        composition_scores(weights, "x")  # type: ignore[arg-type]
