"""What runs a ``POST /api/attention`` request once it is admitted: a run turned into the
viewer's data (colour modes added, weights checked finite), and an encoder-decoder's source
and target run (its target written by the model when none is given)."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi.concurrency import run_in_threadpool

from attnkit.functional.finite import check_finite
from attnkit.serve.admission import (
    Admitted,
    check_text,
    checked_indices,
    count_tokens,
    http_error,
    refuse_modes,
    stack_layers,
)
from attnkit.serve.bodies import AttentionRequest
from attnkit.serve.limits import GENERATED_TOKENS, Limits
from attnkit.serve.served import ServedModel
from attnkit.viz.terminal import counted
from attnkit.viz.viewer import viewer_data_from_encoder_decoder, viewer_data_from_run


def page_data(s: ServedModel, run: Any, admitted: Admitted, request: AttentionRequest) -> Any:
    """The viewer's data of a run, with the colour modes of ``request`` added as sections, as
    the exported page has them.

    Raises:
        HTTPException: 422 for weights that are not finite, or what the methods refuse.
    """
    from dataclasses import replace

    from attnkit.viz.viewer.adapters import mode_sections

    data = _viewer_data(s.model, run, s.name, admitted.text, request.level)
    if not request.modes:
        return data
    try:
        own = data.sections["self"]
        extra = mode_sections(
            s.model, admitted.text, request.modes, layers=own.layers, heads=own.heads, level=request.level
        )
    except ValueError as err:
        raise http_error(422, str(err)) from None
    return replace(data, sections={**data.sections, **extra})


def _viewer_data(model: Any, run: Any, name: str, text: str, level: str) -> Any:
    """The viewer's data of a run, its weights checked finite.

    Raises:
        HTTPException: 422 naming the layer whose weights are NaN or infinite.
    """
    try:
        for layer, weights in run.attentions.items():
            check_finite(weights, f"the attention weights of layer {layer} of {name}")
        return viewer_data_from_run(model, run, name=name, text=text, level=level)
    except ValueError as err:
        raise http_error(422, str(err)) from None


async def run_encoder_decoder(request: AttentionRequest, s: ServedModel, limits: Limits) -> Any:
    """The viewer data of an encoder-decoder request: the source (``text``) and the target
    (``decoder_text``, or the model's own greedy one when it is absent or blank), with the
    encoder, decoder and cross-attention of the asked layers (each stack the indices it
    has; ``"last"``: each stack's own last layer) and heads, checked first as
    :func:`attnkit.serve.admission.admit` checks a text.

    Raises:
        HTTPException: 422 naming what is wrong and, for too many weights, what would fit.
    """
    model: Any = s.model  # an encoder-decoder attnkit.models.Model, beyond the protocol: run_encoder_decoder
    refuse_modes(request, s)
    check_text(request.text, limits.max_chars)
    target = request.decoder_text if request.decoder_text is not None and request.decoder_text.strip() else None
    if target is not None:
        check_text(target, limits.max_chars, "the decoder text")
    encoder_depth, decoder_depth = model.num_layers, int(model.num_decoder_layers)
    counts = model.heads_per_kind  # BART's stacks may have different head counts
    heads = checked_indices(request.heads, max(counts.values()), "head", s.name)
    # Each stack shows the asked layers and heads it has; a stack with none of the heads, none.
    kept = {kind: [head for head in heads if head < count] for kind, count in counts.items()}
    layers, asked_encoder, asked_decoder = stack_layers(request.layers, encoder_depth, decoder_depth, s.name)
    s_src = await count_tokens(request.text, s)
    encoder_layers = asked_encoder if kept["encoder"] else []
    decoder_layers = asked_decoder if kept["decoder"] and kept["cross"] else []
    if not encoder_layers and not decoder_layers:
        raise http_error(422, f"{s.name} has none of these layers and heads in one stack: heads per kind {counts}")
    # (a stack with none of the heads computes no layer; any valid head stands in for its list)
    kept = {kind: chosen or [0] for kind, chosen in kept.items()}

    def run(target: Any, **asked: Any) -> Any:
        with s.encoder_decoder_lock:
            return model.run_encoder_decoder(request.text, target, heads=kept, **asked)

    written = None
    if target is None:
        # The model writes the target first (no weights), so that the limit below counts
        # the tokens it wrote.
        try:
            written = await run_in_threadpool(
                run, None, encoder_layers=[], decoder_layers=[], max_new_tokens=min(s.max_tokens, GENERATED_TOKENS)
            )
        except ValueError as err:
            raise http_error(422, str(err)) from None
        s_tgt = written.target_ids.shape[1]
    else:
        s_tgt = await count_tokens(target, s, "the target (decoder_text)")
    weights = len(kept["encoder"]) * len(encoder_layers) * s_src**2 + len(decoder_layers) * (
        len(kept["decoder"]) * s_tgt**2 + len(kept["cross"]) * s_tgt * s_src
    )
    if weights > limits.max_weights:
        raise http_error(
            422,
            f"{counted(len(layers), 'layer')} x {counted(len(heads), 'head')} of {counted(s_src, 'source token')} "
            f"and {counted(s_tgt, 'target token')} is {weights} weights, more than this server's limit of "
            f"{limits.max_weights}: ask for fewer layers or heads",
        )

    def work() -> Any:
        if written is None:
            result = run(target, encoder_layers=encoder_layers, decoder_layers=decoder_layers)
        else:
            result = run(written.target_ids, encoder_layers=encoder_layers, decoder_layers=decoder_layers)
            result = dataclasses.replace(result, target_text=written.target_text, generated=True)
        return viewer_data_from_encoder_decoder(model, result, name=s.name, level=request.level)

    try:
        return await run_in_threadpool(work)
    except ValueError as err:
        raise http_error(422, str(err)) from None
