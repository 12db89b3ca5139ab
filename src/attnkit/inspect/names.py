"""What the inspection tools are asked for by name — the methods of a map, the statistics of
a head survey, the example text — and their limits: plain data, importable without PyTorch,
so that the command line offers and checks them before it loads anything heavy."""

from __future__ import annotations

# The attentions of an encoder-decoder: the model's own names, which the command line takes
# from here with the others.
from attnkit.models.model.names import ATTENTION_KINDS as ATTENTION_KINDS

# The default sentence of `attnkit inspect`.
EXAMPLE_TEXT = "The cat sat on the mat."

# The query row `attnkit explain` shows on its worked example.
EXAMPLE_QUERY = "sat"

# What the rows and columns of a map stand for: tokens, or words of the text.
LEVELS = ("token", "word")

# What a map shows (attnkit.inspect.methods).
METHODS = ("raw", "rollout", "flow", "value", "grad")

# The methods a viewer page shows as colour modes beside its weights (attnkit.viz.viewer), each
# a section of its own: "value", value-weighted attention ‖α·f(x)‖ with each map scaled so
# that its largest value is 1; "rollout", attention rollout up to each layer, one map per
# layer (head 0 stands for the merged heads).
VIEWER_MODES: tuple[str, ...] = ("value", "rollout")

# The colour scales of the pictures (attnkit.viz.heatmap): weight as it is, its square root,
# or its logarithm.
SCALES = ("linear", "sqrt", "log")

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
# Activation patching (attnkit.inspect.interventions).
# Where a patch acts: one head's z at every position; a component of one layer at one
# position; a component at one position in every layer asked for; one (destination, source)
# cell of the pattern in every head and layer asked for; one head's per-head component at one position.
BY = ("head", "layer-position", "position", "dest-src", "head-position")
# What a patch replaces, by the end of its hook name in a layer (attnkit.nn.hooks): the
# residual stream into the layer, between its blocks and out of it, the attention and
# feed-forward blocks' outputs, and each head's output before the output projection.
COMPONENTS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "z", "q", "k", "v", "pattern")
# The components with a head dimension: patched by head (every position) or by position
# (every head at that query position; a pattern's row of that query).
PER_HEAD = ("z", "q", "k", "v", "pattern")
# The metrics named by a string: of causal models, the logit difference between the target
# and the wrong token and the target's log-probability at the last position; of encoders,
# the cosine of the sentence embedding to the clean text's.
METRICS = ("logit-diff", "log-p", "cosine")
# The head detectors of attnkit.inspect.detectors.
DETECTORS = ("previous-token", "duplicate-token", "induction")
