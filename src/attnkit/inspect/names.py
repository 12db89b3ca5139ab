"""What the inspection tools are asked for by name — the methods of a map, the statistics of
a head survey, the example text — and their limits: plain data, importable without PyTorch,
so that the command line offers and checks them before it loads anything heavy."""

from __future__ import annotations

# The default sentence of `attnkit inspect`.
EXAMPLE_TEXT = "The cat sat on the mat."

# The query row `attnkit explain` shows on its worked example.
EXAMPLE_QUERY = "sat"

# What the rows and columns of a map stand for: tokens, or words of the text.
LEVELS = ("token", "word")

# What a map shows (attnkit.inspect.methods).
METHODS = ("raw", "rollout", "flow", "value", "grad")

# The longest input attention flow accepts. It solves up to s * s maximum flows on a graph of
# (L + 1) * s nodes and L * s * s edges (benchmarks/bench_flow.py measures it): on two CPU
# cores 64 tokens take 6 to 8 s of processor time through MiniLM's 6 layers, and 61 of
# SmolLM2's tokens 15 s through its 30 causal layers.
FLOW_MAX_TOKENS = 64

# Length of the random segment the induction score repeats (as in Olsson et al., 2022).
INDUCTION_PERIOD = 50

# What each statistic of a head survey measures, for tables, pictures and JSON.
STATISTICS = {
    "entropy": "entropy of the attention (bits)",
    "distance": "mean distance to the attended keys (tokens)",
    "previous": "mass on the previous token",
    "first": "mass on the first token (attention sink)",
    "self": "mass on the token itself",
    "induction": "induction score on repeated random tokens",
}
# The statistics of an encoder-decoder's cross-attention that self-attention has not
# (attnkit.inspect.encoder_decoder.survey_encoder_decoder).
CROSS_STATISTICS = {
    "last": "mass on the last source token (end of sequence)",
    "alignment": "aligned target words whose most-attended source word is aligned",
}

# The attentions of an encoder-decoder (attnkit.models.model.encoder_decoder.ATTENTION_KINDS, which
# imports PyTorch; a test keeps the two equal).
ATTENTION_KINDS = ("encoder", "decoder", "cross")
# The head detectors of attnkit.inspect.detectors.
DETECTORS = ("previous-token", "duplicate-token", "induction")
