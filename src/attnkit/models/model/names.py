"""What a :class:`~attnkit.models.Model` is asked for by name — the attentions of an
encoder–decoder, the dtypes its weights load in — as plain data, importable without PyTorch,
so that the command line offers and checks them before it loads anything heavy."""

from __future__ import annotations

# The attentions of an encoder-decoder: its encoder's self-attention, its decoder's, and the
# decoder's cross-attention to the encoder.
ATTENTION_KINDS: tuple[str, ...] = ("encoder", "decoder", "cross")

# The dtypes attnkit.models.load takes by name (attnkit.models.loading.DTYPES), besides "auto".
DTYPE_NAMES: tuple[str, ...] = ("float32", "bfloat16", "float16")
