"""The bridge: any causal language model ``transformers`` 5 ships whose attention runs
through its ``AttentionInterface``, as an :class:`attnkit.models.Model`, for the
``model_type`` values attnkit has no family for (:data:`attnkit.models.families.table.FAMILIES`).

``transformers`` builds the network and reads the safetensors weights (never pickle, never
``trust_remote_code``); attnkit registers its attention function
(:mod:`attnkit.models.families.bridge_attention`) and wraps the network in a :class:`BridgedLM`, an
:class:`attnkit.nn.text_module.TextModule` with attnkit's hook point names:

* ``decoder.layers.N.self_attn.{q, k, v, scores, pattern, z, result}``: inside attention, as
  in attnkit's own layers (``q`` and ``k`` after the rotary encoding);
* ``decoder.layers.N.{resid_pre, attn_out, mlp_out, resid_post}``: the input of
  ``transformers``' decoder layer, the outputs of its attention and MLP modules (before any
  norm the architecture applies after them) and the layer's output;
* ``embed`` (the token embedding module's output) and ``decoder.final`` (the last hidden
  state, after the final norm).

A probe forward at load checks that attnkit's attention function ran exactly once in each
decoder layer, and that the head applied to the last hidden state gives the model's logits;
an architecture that computes attention elsewhere (in ``transformers`` 5.24 e.g. ``bloom``,
``falcon``, ``mpt``) is refused in one line, never run half-bridged. A bridged model's
:attr:`attnkit.models.Model.family` is ``bridge:<model_type>``.

Shape letters: ``b`` batch, ``s`` tokens, ``e`` model dim, ``v`` vocabulary size.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.models.checkpoints.config_reader import token_ids
from attnkit.models.checkpoints.errors import CheckpointError, require
from attnkit.models.checkpoints.files import weight_files
from attnkit.models.checkpoints.memory import check_fits, weight_bytes
from attnkit.models.checkpoints.weights import read_headers
from attnkit.models.families.bridge_attention import (
    ATTENTION_NAME,
    AttentionCall,
    BridgedAttention,
    BridgeRefused,
    attnkit_attention_forward,
    probing,
    returning_weights,
)
from attnkit.models.families.decoder import eos_token_ids
from attnkit.models.families.family import ModelFamily
from attnkit.models.families.table import unsupported_model_type
from attnkit.nn.hooks import HookPoint
from attnkit.nn.lm import check_decoding_options, decoding_loop, soft_cap_logits
from attnkit.nn.records import LayerWeights, StackOutput
from attnkit.nn.text_module import TextModule, check_token_ids, padding_positions
from attnkit.nn.transformer import LayerSelection
from attnkit.nn.weight_selection import WeightSelection

BRIDGE_PREFIX = "bridge:"
# The module names under which transformers' decoder layers keep their MLP.
_MLP_NAMES = ("mlp", "feed_forward", "block_sparse_moe", "moe", "ffn")
# Tokens of the probe forward.
_PROBE_LENGTH = 6


@dataclass(frozen=True)
class BridgeConfig:
    """What :class:`attnkit.models.Model` reads of a bridged model's configuration
    (:class:`attnkit.models.families.family.ModelConfig`), from ``transformers``' config and the probe.

    Attributes:
        model_type: the ``model_type`` of ``config.json``.
        vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads,
            head_dim, max_length: sizes (the heads as the probe saw them).
        eos_token_ids: the ids that end a generation (``config.json``'s).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_length: int
    eos_token_ids: tuple[int, ...]


class BridgeLayer(nn.Module):
    """One decoder layer's hook points; ``transformers``' modules call them through
    PyTorch forward hooks (:func:`attach_layer`).

    Attributes:
        self_attn: the layer's :class:`attnkit.models.families.bridge_attention.BridgedAttention`.
        resid_pre, attn_out, mlp_out, resid_post: hook points (``mlp_out`` ``None`` where
            the layer has no MLP module attnkit recognises).
    """

    def __init__(self, self_attn: BridgedAttention, *, has_mlp: bool) -> None:
        super().__init__()
        self.resid_pre = HookPoint()
        self.self_attn = self_attn
        self.attn_out = HookPoint()
        self.mlp_out = HookPoint() if has_mlp else None
        self.resid_post = HookPoint()


class BridgeStack(nn.Module):
    """The layers' hook points (``layers``) and the last hidden state's (``final``)."""

    def __init__(self, layers: list[BridgeLayer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.final = HookPoint()


class BridgedLM(TextModule):
    """A ``transformers`` causal language model with attnkit's hook points
    (module docstring). Built by :func:`load_bridged`.

    Args:
        hf: the ``transformers`` model (``…ForCausalLM``), loaded with
            ``attn_implementation="attnkit"``.
        calls: the probe's attention calls, one per decoder layer, in order.
        layer_modules: ``transformers``' decoder layers, in order.
        label: ``bridge:<model_type>``.
        linear_inputs: each linear map's input in the probe forward (to find the output
            projections).
        rows_may_grow: whether the architecture runs rows that a hook adds at a layer's
            input (``resid_pre``) correctly (:func:`_rows_may_grow`), as ablation and
            patching do; otherwise such a hook is refused.
    """

    def __init__(
        self,
        hf: Any,
        calls: list[AttentionCall],
        layer_modules: list[nn.Module],
        label: str,
        linear_inputs: dict[nn.Module, Tensor],
        *,
        rows_may_grow: bool,
    ) -> None:
        super().__init__()
        self.hf: Any = hf
        self.label = label
        self.embed = HookPoint()
        embed_dim = hf.config.hidden_size
        layers = []
        for index, (call, layer) in enumerate(zip(calls, layer_modules)):
            attention = BridgedAttention(
                call,
                embed_dim=embed_dim,
                layer=index,
                label=label,
                out_proj=_output_projection(call, linear_inputs),
            )
            mlp = next((child for name, child in layer.named_children() if name in _MLP_NAMES), None)
            points = BridgeLayer(attention, has_mlp=mlp is not None)
            attach_layer(points, layer, call.module, mlp, rows_may_grow=rows_may_grow)
            layers.append(points)
        self.decoder = BridgeStack(layers)
        hf.get_input_embeddings().register_forward_hook(partial(_through_point, self.embed))
        self.base.register_forward_hook(partial(_last_hidden_through, self.decoder.final))
        self.logit_scale, self.logit_softcap = _logit_transform(hf.config)

    @property
    def base(self) -> nn.Module:
        """``transformers``' base model (without the head)."""
        base: nn.Module = self.hf.base_model
        return base

    def last_hidden_state(
        self, tokens: Tensor, *, padding: Tensor | None = None, return_weights: LayerSelection = False
    ) -> Tensor | StackOutput:
        """The last hidden state (after the final norm) for ids ``[b, s]``, with the weights
        of the layers asked for (see :meth:`attnkit.nn.text_module.TextModule.last_hidden_state`).

        Raises:
            TypeError: non-integer ids.
            ValueError: ids not ``[b, s]``, padding of another shape, a layer out of range.
        """
        check_token_ids(tokens)
        count = len(self.decoder.layers)
        # Each layer asked for: every head's weights (True) or a WeightSelection's part.
        asked: dict[int, bool | WeightSelection] = {}
        if return_weights is True:
            asked = dict.fromkeys(range(count), True)
        elif return_weights is not False:
            chosen = return_weights if isinstance(return_weights, Mapping) else dict.fromkeys(return_weights, True)
            asked = {i + count if i < 0 else i: part for i, part in chosen.items()}
            if any(not 0 <= i < count for i in asked):
                raise ValueError(f"layer indices must be in [-{count}, {count}), got {list(return_weights)}")
        options: dict[str, Any] = {"use_cache": False}
        if padding is not None:
            _, positions = padding_positions(padding, tokens)  # [b, s]
            options |= {"attention_mask": padding.long(), "position_ids": positions}
        with returning_weights(asked) as weights:
            hidden = self.base(input_ids=tokens, **options).last_hidden_state  # [b, s, e]
        if return_weights is False:
            return hidden
        return StackOutput(hidden, [LayerWeights(weights[i]) if i in weights else None for i in range(count)])

    def logits(self, hidden: Tensor) -> Tensor:
        """The head on hidden states ``[..., e]``, with the architecture's own scaling and
        soft-capping of the logits: ``[..., v]``."""
        logits: Tensor = self.hf.get_output_embeddings()(hidden)  # [..., v]
        if self.logit_scale != 1.0:
            logits = logits * self.logit_scale
        return soft_cap_logits(logits, self.logit_softcap)

    def self_attention(self, layer: int) -> BridgedAttention:
        """Layer ``layer``'s :class:`attnkit.models.families.bridge_attention.BridgedAttention`."""
        attention = self.decoder.layers[layer].self_attn
        assert isinstance(attention, BridgedAttention)
        return attention

    def stream(
        self,
        tokens: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        use_kv_cache: bool = True,
    ) -> Iterator[Tensor]:
        """The decoding loop of :meth:`attnkit.nn.DecoderLM.stream`, with ``transformers``'
        own KV cache: the prompt once, then one token per step (without the cache, the
        whole sequence so far at every step).

        Raises:
            ValueError: ``max_new_tokens < 0``, ``temperature < 0``, ``top_k < 1``, ``top_p``
                outside ``(0, 1]``.
        """
        check_decoding_options(max_new_tokens, temperature, top_k, top_p)
        cache = require("transformers").DynamicCache(config=self.hf.config) if use_kv_cache else None

        def next_logits(step_input: Tensor) -> Tensor:
            hidden = self.base(input_ids=step_input, cache=cache, use_cache=use_kv_cache).last_hidden_state
            return self.logits(hidden[:, -1])  # [b, v]

        return decoding_loop(
            next_logits, tokens, max_new_tokens, temperature, top_k, generator, feed_all=not use_kv_cache, top_p=top_p
        )


def attach_layer(
    points: BridgeLayer, layer: nn.Module, attention: nn.Module, mlp: nn.Module | None, *, rows_may_grow: bool
) -> None:
    """Call ``points``' hook points from ``transformers``' modules of one decoder layer, and
    route its attention function to ``points.self_attn``."""
    attention.__dict__["_attnkit_bridge"] = points.self_attn  # read by the attention function
    layer.register_forward_pre_hook(
        partial(_layer_input_through, points.resid_pre, points.self_attn.label if not rows_may_grow else None),
        with_kwargs=True,
    )
    attention.register_forward_hook(partial(_through_point, points.attn_out))
    if mlp is not None and points.mlp_out is not None:
        mlp.register_forward_hook(partial(_through_point, points.mlp_out))
    layer.register_forward_hook(partial(_through_point, points.resid_post))
    projection = points.self_attn.__dict__["_out_proj"]
    if projection is not None:
        projection.register_forward_hook(points.self_attn.result_hook)


def _through_point(point: HookPoint, module: nn.Module, inputs: Any, output: Any) -> Any:
    """A forward hook: a module's output (the first of a tuple) through ``point``."""
    if not point.active:
        return None
    if isinstance(output, Tensor):
        return point(output)
    return (point(output[0]), *output[1:])


def _layer_input_through(
    point: HookPoint, fixed_rows: str | None, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """A forward pre-hook: a decoder layer's hidden states through ``point``; rows added by
    a hook are refused where the architecture (``fixed_rows``, its label) cannot run them."""
    if not point.active:
        return None
    hidden = args[0] if args else kwargs["hidden_states"]
    replaced = point(hidden)
    if fixed_rows is not None and replaced.shape[0] != hidden.shape[0]:
        raise BridgeRefused(
            f"{fixed_rows}: a hook on {point.name} added rows, which its transformers code cannot run (it fixes the "
            "batch at the embeddings); ablation and patching of this architecture are not available"
        )
    if args:
        return (replaced, *args[1:]), kwargs
    return args, kwargs | {"hidden_states": replaced}


def _last_hidden_through(point: HookPoint, module: nn.Module, inputs: Any, output: Any) -> Any:
    """A forward hook on the base model: its last hidden state through ``point``."""
    if point.active:
        output.last_hidden_state = point(output.last_hidden_state)
    return output


def _output_projection(call: AttentionCall, linear_inputs: dict[nn.Module, Tensor]) -> nn.Linear | None:
    """The linear map of ``call.module`` that read the attention function's output (found
    in the probe: its input equals that output, heads merged), or ``None``."""
    found: list[nn.Linear] = []
    merged = call.output.reshape(*call.output.shape[:2], -1)  # [b, s, h · d]
    for candidate in call.module.modules():
        if isinstance(candidate, nn.Linear) and candidate.in_features == merged.shape[-1]:
            seen = linear_inputs.get(candidate)
            if seen is not None and seen.shape == merged.shape and torch.equal(seen, merged):
                found.append(candidate)
    return found[0] if len(found) == 1 else None


def _logit_transform(config: Any) -> tuple[float, float | None]:
    """``(scale, softcap)`` that turn the head's output into the logits: Cohere's
    ``logit_scale``, Granite's ``1 / logits_scaling``, ``final_logit_softcapping``."""
    scale = float(getattr(config, "logit_scale", None) or 1.0)
    scale /= float(getattr(config, "logits_scaling", None) or 1.0)
    softcap = getattr(config, "final_logit_softcapping", None)
    return scale, (float(softcap) if softcap else None)


def bridgeable(model_type: str) -> bool:
    """Whether ``transformers`` (if installed) has a causal language model for
    ``model_type``."""
    try:
        import transformers
    except ImportError:
        return False
    auto = transformers.models.auto.modeling_auto
    return model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def calls_attention_interface(model_type: str) -> bool:
    """Whether the ``transformers`` code of ``model_type``'s causal language model looks its
    attention function up in the attention interface (``ALL_ATTENTION_FUNCTIONS``) at all:
    a first, static check before anything is loaded; the probe forward checks each layer."""
    import transformers

    auto = transformers.models.auto
    module_name = auto.configuration_auto.model_type_to_module_name(model_type)
    try:
        modeling = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    except ImportError:
        return False
    source = Path(modeling.__file__ or "").read_text(encoding="utf-8") if modeling.__file__ else ""
    return "ALL_ATTENTION_FUNCTIONS" in source


def register_attention() -> None:
    """Register attnkit's attention function (and SDPA's boolean masks for it) in
    ``transformers``' interfaces under :data:`ATTENTION_NAME`."""
    transformers = require("transformers")
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    transformers.AttentionInterface.register(ATTENTION_NAME, attnkit_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, sdpa_mask)


def bridge_family(model_type: str) -> ModelFamily:
    """The :class:`attnkit.models.families.family.ModelFamily` record a bridged model carries: its
    name ``bridge:<model_type>``; ``transformers`` builds and loads the network."""

    def built_by_transformers(*args: Any) -> Any:
        raise BridgeRefused(f"{BRIDGE_PREFIX}{model_type} is built and loaded by transformers: use attnkit.models.load")

    return ModelFamily(
        name=BRIDGE_PREFIX + model_type,
        model_type=model_type,
        causal=True,
        read_config=built_by_transformers,
        build=built_by_transformers,
        state_dict_from_hf=built_by_transformers,
        finish=built_by_transformers,
        eos_token_ids=eos_token_ids,
        summary="transformers' own modules, attention through attnkit (the bridge)",
    )


def load_bridged(
    folder: Path, hf_config: dict[str, Any], *, dtype: torch.dtype, device: torch.device, name: str
) -> tuple[ModelFamily, BridgeConfig, BridgedLM]:
    """Load a checkpoint folder through ``transformers`` with attnkit's attention, and probe it.

    Args:
        folder: the checkpoint folder (``config.json``, safetensors weights).
        hf_config: its ``config.json``.
        dtype: the weights' dtype.
        device: where to put them.
        name: the model's name, for messages.

    Returns:
        ``(family, config, network)`` for an :class:`attnkit.models.Model`.

    Raises:
        CheckpointError: a ``model_type`` ``transformers`` has no causal language model
            for, an architecture whose attention bypasses the interface (or passes options
            attnkit does not reproduce), weights that do not fit the configuration or are
            not finite.
        MemoryEstimateError: weights larger than the memory free on ``device``.
    """
    model_type = str(hf_config.get("model_type"))
    label = BRIDGE_PREFIX + model_type
    config_path = folder / "config.json"
    transformers = require("transformers")
    if not calls_attention_interface(model_type):
        why = (
            ": its transformers code computes attention without transformers' attention interface, which the bridge "
            "runs through"
        )
        raise CheckpointError(config_path, unsupported_model_type(model_type, why), field="model_type")
    register_attention()
    headers = read_headers(weight_files(folder))
    smaller = "" if dtype.itemsize <= 2 else "load in bfloat16 (--dtype bfloat16) to halve it, or "
    check_fits(
        weight_bytes(headers, dtype),
        device,
        what=f"the weights of {name} in {str(dtype).removeprefix('torch.')}",
        advice=f"{smaller}free memory or use a smaller model",
    )
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        folder,
        attn_implementation=ATTENTION_NAME,
        dtype=dtype,
        use_safetensors=True,
        trust_remote_code=False,
        local_files_only=True,
        output_loading_info=True,
    )
    faults = {kind: sorted(info.get(kind) or ()) for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(faults.values()):
        shown = ", ".join(f"{kind.replace('_', ' ')} {keys[:5]}" for kind, keys in faults.items() if keys)
        raise CheckpointError(folder, f"the weights do not fit the configuration: {shown}", field="weights")
    for key, parameter in hf.named_parameters():
        if not bool(torch.isfinite(parameter).all()):
            raise CheckpointError(folder, f"weight {key} holds NaN or infinite values", field=key)
    hf = hf.to(device).eval()
    try:
        calls, layers, linear_inputs = _probe(hf, label)
    except BridgeRefused as refused:
        raise CheckpointError(config_path, str(refused), field="model_type") from None
    module = BridgedLM(hf, calls, layers, label, linear_inputs, rows_may_grow=_rows_may_grow(hf, layers))
    _check_logits(module, label, config_path)
    config = _bridge_config(model_type, hf.config, calls, config_path)
    return bridge_family(model_type), config, module


def _probe(hf: Any, label: str) -> tuple[list[AttentionCall], list[nn.Module], dict[nn.Module, Tensor]]:
    """Run a short forward and check that attnkit's attention function ran exactly once in
    each decoder layer: the calls in order, the decoder layers, and each linear map's input.

    Raises:
        BridgeRefused: no call, calls outside one stack of decoder layers, or other than one
            per layer.
    """
    linear_inputs: dict[nn.Module, Tensor] = {}
    handles = [
        m.register_forward_pre_hook(lambda module, inputs: linear_inputs.__setitem__(module, inputs[0]))
        for m in hf.modules()
        if isinstance(m, nn.Linear)
    ]
    ids = torch.arange(_PROBE_LENGTH, device=next(hf.parameters()).device)[None] % hf.config.vocab_size
    try:
        with probing() as calls, torch.no_grad():
            hf(input_ids=ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    if not calls:
        raise BridgeRefused(
            f"{label}: its attention bypasses transformers' attention interface (attnkit's attention function never "
            "ran in a forward pass), so the bridge cannot see or change it"
        )
    modules = [call.module for call in calls]
    stack = _decoder_layers(hf, modules)
    if stack is None or len(set(map(id, modules))) != len(modules):
        raise BridgeRefused(
            f"{label}: attnkit's attention function ran {len(calls)} times, not exactly once in each decoder layer "
            "(some layers compute attention another way), so the bridge refuses it"
        )
    shapes = {(call.num_heads, call.num_kv_heads, call.head_dim) for call in calls}
    if len(shapes) > 1:
        raise BridgeRefused(
            f"{label}: its layers have different numbers or sizes of heads ({sorted(shapes)}), which "
            "attnkit.models.Model does not describe"
        )
    return calls, stack, linear_inputs


def _rows_may_grow(hf: Any, layers: list[nn.Module]) -> bool:
    """Whether rows added at the last layer's input run as rows of their own: a forward
    whose hidden states are doubled there gives each copy the logits of the plain forward."""
    ids = torch.arange(_PROBE_LENGTH, device=next(hf.parameters()).device)[None] % hf.config.vocab_size

    def double(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args:
            return (torch.cat([args[0], args[0]]), *args[1:]), kwargs
        return args, kwargs | {"hidden_states": torch.cat([kwargs["hidden_states"]] * 2)}

    with probing(), torch.no_grad():
        plain = hf(input_ids=ids, use_cache=False).logits  # [1, s, v]
        handle = layers[-1].register_forward_pre_hook(double, with_kwargs=True)
        try:
            doubled = hf(input_ids=ids, use_cache=False).logits  # [2, s, v]
        except (RuntimeError, ValueError):
            return False
        finally:
            handle.remove()
    return doubled.shape[0] == 2 and bool(torch.allclose(doubled, plain.expand_as(doubled), rtol=1e-5, atol=1e-6))


def _decoder_layers(hf: nn.Module, modules: list[nn.Module]) -> list[nn.Module] | None:
    """The one ``nn.ModuleList`` of ``hf`` whose ``i``-th entry holds ``modules[i]``, and no
    other entry of it holds any, as a list; ``None`` when there is none."""
    for candidate in hf.modules():
        if isinstance(candidate, nn.ModuleList) and len(candidate) == len(modules):
            inside = [{id(m) for m in layer.modules()} for layer in candidate]
            if all(
                (id(module) in inside[j]) == (i == j) for i, module in enumerate(modules) for j in range(len(modules))
            ):
                return list(candidate)
    return None


def _check_logits(module: BridgedLM, label: str, config_path: Path) -> None:
    """Refuse an architecture whose logits are not its head (with the known scalings)
    applied to the last hidden state."""
    ids = torch.arange(_PROBE_LENGTH, device=next(module.parameters()).device)[None] % module.hf.config.vocab_size
    with torch.no_grad():
        expected = module.hf(input_ids=ids, use_cache=False).logits.float()
        hidden = module.last_hidden_state(ids)
        assert isinstance(hidden, Tensor)
        got = module.logits(hidden).float()
    if not torch.allclose(got, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()) + 1e-6):
        raise CheckpointError(
            config_path,
            f"{label}: its logits are not its head applied to its last hidden state (a transform attnkit does not "
            "know), so the bridge refuses it",
            field="model_type",
        )


def _bridge_config(model_type: str, config: Any, calls: list[AttentionCall], path: Path) -> BridgeConfig:
    """The sizes a bridged :class:`attnkit.models.Model` reports."""
    first = calls[0]
    vocab = int(config.vocab_size)
    intermediate = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None)
    context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return BridgeConfig(
        model_type=model_type,
        vocab_size=vocab,
        hidden_size=int(config.hidden_size),
        intermediate_size=int(intermediate or 4 * config.hidden_size),
        num_layers=len(calls),
        num_heads=first.num_heads,
        num_kv_heads=first.num_kv_heads,
        head_dim=first.head_dim,
        max_length=int(context or 2048),
        eos_token_ids=token_ids(getattr(config, "eos_token_id", None), vocab, path),
    )
