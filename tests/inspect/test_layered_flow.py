"""Maximum flows through a layered graph, many pairs per call to SciPy's solver, against
networkx solving each pair on its own."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from attnkit.inspect import layered_flow
from attnkit.inspect.layered_flow import layered_max_flows


def reference_flows(caps: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """networkx's preflow-push on the whole layered graph, one pair at a time."""
    levels, s = caps.shape[0], caps.shape[1]
    graph = nx.DiGraph()
    for t in range(levels):
        for i in range(s):
            for k in range(s):
                graph.add_edge((t, k), (t + 1, i), capacity=float(caps[t, i, k]))
    return np.array([nx.maximum_flow_value(graph, (0, j), (levels, i)) for i, j in pairs])


def random_layers(rng: np.random.Generator, levels: int, s: int, *, zeros: float = 0.0) -> np.ndarray:
    """Row-stochastic capacities with a strong diagonal, as attention with its residual path,
    some entries exactly zero."""
    caps = rng.random((levels, s, s)) ** 3 + np.eye(s)
    caps[rng.random(caps.shape) < zeros] = 0.0
    return caps / np.maximum(caps.sum(-1, keepdims=True), 1e-12)


def all_pairs(s: int) -> np.ndarray:
    return np.array([(i, j) for i in range(s) for j in range(s)])


@pytest.mark.parametrize(("levels", "s", "zeros"), [(1, 5, 0.0), (2, 4, 0.3), (3, 6, 0.0), (5, 5, 0.5), (4, 7, 0.2)])
def test_equals_networkx_on_random_layered_graphs(levels, s, zeros):
    caps = random_layers(np.random.default_rng(levels * 100 + s), levels, s, zeros=zeros)
    pairs = all_pairs(s)
    ours = layered_max_flows(caps, pairs)
    assert np.abs(ours - reference_flows(caps, pairs)).max() < 1e-6


def test_a_causal_graph_has_no_flow_from_later_tokens():
    """Within the tolerance: a flow is the real capacity of a cut, here one of edges too
    small for the integer scale, which the solver saw as absent."""
    s = 6
    caps = np.tril(random_layers(np.random.default_rng(3), 3, s))
    caps /= caps.sum(-1, keepdims=True)
    pairs = all_pairs(s)
    ours = layered_max_flows(caps, pairs).reshape(s, s)
    assert np.abs(np.triu(ours, 1)).max() <= layered_flow.GAP_TOLERANCE
    assert np.abs(ours.ravel() - reference_flows(caps, pairs)).max() < 1e-6


def test_several_batches_and_pairs_solved_again_alone(monkeypatch):
    """More pairs than one batch holds, the last batch short; a gap tolerance of zero sends
    every pair whose bounds differ at all to be solved again, alone, at the finest scale."""
    monkeypatch.setattr(layered_flow, "BATCH", 7)
    monkeypatch.setattr(layered_flow, "GAP_TOLERANCE", 0.0)
    caps = random_layers(np.random.default_rng(5), 4, 5, zeros=0.1)
    pairs = all_pairs(5)[::-1]  # any order
    assert np.abs(layered_max_flows(caps, pairs) - reference_flows(caps, pairs)).max() < 1e-6


def test_tiny_capacities_are_scaled_up_not_rounded_away():
    """The integer scale follows the largest flow possible: capacities of a billionth are
    solved as precisely as capacities of one."""
    caps = random_layers(np.random.default_rng(8), 3, 4) * 1e-9
    pairs = all_pairs(4)
    expected = reference_flows(caps, pairs)
    assert np.abs(layered_max_flows(caps, pairs) - expected).max() < 1e-15 + 1e-6 * expected.max()


def test_no_pairs_and_bad_inputs():
    caps = random_layers(np.random.default_rng(0), 2, 3)
    assert layered_max_flows(caps, np.zeros((0, 2), dtype=int)).shape == (0,)
    with pytest.raises(ValueError, match=r"capacities must be \[levels, s, s\].*got shape \[2, 3\]"):
        layered_max_flows(caps[0, :2], all_pairs(3))
    with pytest.raises(ValueError, match="finite and >= 0"):
        layered_max_flows(-caps, all_pairs(3))
    with pytest.raises(ValueError, match=r"pairs must be \[n, 2\]"):
        layered_max_flows(caps, np.zeros(4, dtype=int))
    with pytest.raises(ValueError, match=r"0 <= i, j < 3, got indices 0 \.\. 3"):
        layered_max_flows(caps, np.array([[0, 3]]))
