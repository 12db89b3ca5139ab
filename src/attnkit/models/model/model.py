"""The :class:`Model` that runs a checkpoint on attnkit modules (:func:`attnkit.models.load`
makes one): what it holds. Its jobs are mixins, each in its own module over a small
protocol (:mod:`attnkit.models.model.core`): runs on one input or several
(:mod:`attnkit.models.model.running`), tokens (:mod:`attnkit.models.model.tokens`), the hook
API (:mod:`attnkit.models.model.hooks`), generation (:mod:`attnkit.models.model.generation`),
an encoder–decoder's source-and-target runs (:mod:`attnkit.models.model.encoder_decoder`) and
TransformerLens-style weights, logit lens and attribution (:mod:`attnkit.models.model.lens`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnkit.deprecation import deprecated_aliases
from attnkit.models.checkpoints.tokenizer import Tokenizer
from attnkit.models.families.family import ModelConfig, ModelFamily
from attnkit.models.model.encoder_decoder import EncoderDecoderMixin
from attnkit.models.model.generation import GenerationMixin
from attnkit.models.model.hooks import HooksMixin
from attnkit.models.model.lens import LensMixin
from attnkit.models.model.running import RunMixin
from attnkit.models.model.runs import HookedRun, ModelRun, RunStopped
from attnkit.models.model.tokens import TokensMixin
from attnkit.nn.text_module import TextModule

__all__ = ["HookedRun", "Model", "ModelRun", "RunStopped"]


@deprecated_aliases(
    architecture="model_family",
    run_seq2seq="run_encoder_decoder",
    run_seq2seq_batch="run_encoder_decoder_batch",
    removed_in="0.3",
)
class Model(RunMixin, TokensMixin, HooksMixin, GenerationMixin, EncoderDecoderMixin, LensMixin):
    """A real checkpoint on attnkit modules, with its tokenizer. Get one with :func:`load`.

    Attributes:
        name: ``"smollm2"``, ``"minilm"``, or the folder name of a local checkpoint.
        family: the :attr:`attnkit.models.families.family.ModelFamily.name` of
            ``model_family``: the ``model_type`` of its ``config.json`` (``"llama"``,
            ``"gemma3_text"``, ``"bert"``, ``"t5"``, …; ``"transformer"`` for a model of
            ``attnkit train``), or ``"bridge:<model_type>"`` for a model run through
            ``transformers``' attention interface.
        model_family: the :class:`attnkit.models.families.family.ModelFamily` it was loaded with.
        path: the checkpoint folder.
        config: the family's config, a :class:`attnkit.models.families.family.ModelConfig`:
            :class:`attnkit.models.families.decoder.DecoderConfig` for the causal decoders,
            :class:`attnkit.models.families.bert.BertConfig`,
            :class:`attnkit.models.families.t5.T5Config`,
            :class:`attnkit.models.families.bart.BartConfig`, ….
        num_layers: depth.
        num_heads: query heads per layer (an encoder–decoder's encoder; each stack's in
            :attr:`heads_per_kind`).
        num_kv_heads: key/value heads per layer (fewer than ``num_heads`` with GQA).
        max_length: the most tokens one text may have (the model's context).
        causal: whether a token attends only to itself and earlier tokens.
        encoder_decoder: an encoder–decoder (T5, BART): :meth:`run` reads one text with
            its encoder, :meth:`run_encoder_decoder` a source and a target with the three kinds of
            attention, and generation translates a source.
        num_decoder_layers: the decoder's depth (encoder–decoders; 0 otherwise).
        module: the network, in evaluation mode: an :class:`attnkit.nn.DecoderLM`,
            :class:`attnkit.nn.EncoderDecoderLM` or :class:`attnkit.models.families.bert.BertModel`,
            each an :class:`attnkit.nn.text_module.TextModule`, whose methods every run
            calls.
        tokenizer: the :class:`attnkit.models.Tokenizer`.
    """

    def __init__(
        self,
        *,
        name: str,
        model_family: ModelFamily,
        path: Path,
        config: ModelConfig,
        module: TextModule,
        tokenizer: Tokenizer,
    ) -> None:
        self.name = name
        self.model_family = model_family
        self.family = model_family.name
        self.path = path
        self.config = config
        self.module = module
        self.tokenizer = tokenizer
        self.num_layers = config.num_layers
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.max_length = config.max_length
        self.causal = model_family.causal
        self.encoder_decoder = model_family.encoder_decoder
        self.num_decoder_layers = getattr(config, "num_decoder_layers", 0) if self.encoder_decoder else 0
        self._packed = False

    def __repr__(self) -> str:
        return (
            f"Model({self.name!r}, family={self.family!r}, layers={self.num_layers}, heads={self.num_heads}, "
            f"kv_heads={self.num_kv_heads}, max_length={self.max_length})"
        )

    @property
    def device(self) -> torch.device:
        """Where the weights are."""
        return next(self.module.parameters()).device
