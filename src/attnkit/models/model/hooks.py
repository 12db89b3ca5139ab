"""The hook API of a :class:`attnkit.models.Model`: the names of its hook points, hooks
on every run inside a ``with`` block, and forward passes of a batch of ids through the
hook points (:meth:`HooksMixin.run_with_hooks`, :meth:`HooksMixin.run_with_cache`), as a
mixin over the attributes listed on :class:`HooksMixin`, so that it never imports
:mod:`attnkit.models.model`. The points themselves live in the :mod:`attnkit.nn` modules
(:mod:`attnkit.nn.hooks`).

Shape letters: ``b`` batch, ``s`` number of tokens, ``e`` model dim, ``v`` vocabulary size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, Self, overload

import torch
from torch import Tensor

from attnkit.deprecation import renamed_keywords
from attnkit.models.checkpoints.memory import check_run_memory
from attnkit.models.families.family import ModelConfig
from attnkit.models.model.core import ModelCore
from attnkit.models.model.layer_range import (
    PositionSlice,
    ReturnType,
    check_layer,
    check_return_type,
    sliced_positions,
)
from attnkit.models.model.lens import lm_cross_entropy
from attnkit.models.model.runs import HookedRun
from attnkit.nn import ActivationCache, DecoderLM
from attnkit.nn.hooks import HookFn, Hooks, NameFilter, backward_of_scalar
from attnkit.nn.text_module import TextModule


class HooksMixin(ModelCore):
    """The hook API over the attributes below.

    Attributes (what the mixin reads of its class):
        name: for messages.
        module: the network, whose hook points the runs go through.
        num_layers: its depth (layer ranges).
        config: its config (the model dim).
    """

    name: str
    module: TextModule
    num_layers: int
    config: ModelConfig

    if TYPE_CHECKING:  # what other mixins define

        def to_tokens(
            self,
            texts: str | Sequence[str],
            *,
            padding_side: Literal["right", "left"] = "right",
            prepend_bos: bool | None = None,
        ) -> tuple[Tensor, Tensor]: ...

        def loss_fn(
            self, logits: Tensor, ids: Tensor, *, per_token: bool = False, attention_mask: Tensor | None = None
        ) -> Tensor: ...

    def hook_names(self) -> list[str]:
        """Every activation a hook or a cache can name, in module order
        (:mod:`attnkit.nn.hooks`): ``decoder.layers.{i}.self_attn.pattern`` (a causal
        decoder), ``encoder.layers.{i}.self_attn.pattern`` (an encoder), ..."""
        return self.module.hook_names()

    def hook_name(self, name: str, layer: int | None = None) -> str:
        """The full name of a point given by the end of its name and its layer:
        ``hook_name("self_attn.z", 3)`` (:meth:`attnkit.nn.HookedModule.hook_name`).

        Raises:
            ValueError: no point or several match.
        """
        return self.module.hook_name(name, layer)

    @contextlib.contextmanager
    def hooks(
        self,
        hooks: Hooks | None = None,
        *,
        backward_hooks: Hooks | None = None,
        fwd_hooks: Hooks | None = None,
        bwd_hooks: Hooks | None = None,
    ) -> Iterator[Self]:
        """Install functions that read or replace activations in every run of this model
        inside the ``with`` block (in this thread): :meth:`run`, :meth:`run_batch`,
        :meth:`run_with_hooks` and every step of :meth:`generate_ids` started inside it.

        >>> def no_head_3(z, hook):                 # [b, h, s, d]
        ...     z = z.clone(); z[:, 3] = 0; return z
        >>> with model.hooks({"decoder.layers.5.self_attn.z": no_head_3}):
        ...     run = model.run("The cat sat on the mat.")

        Args:
            hooks: name (:meth:`hook_names`) → function of ``(activation, hook)`` (or of
                the activation alone) that returns ``None`` (reads only) or the tensor to
                use instead, or TransformerLens' list of ``(name or predicate, function)``
                pairs (:func:`attnkit.nn.hooks.named_hooks`). Nested blocks apply the
                outer block's hooks first.
            backward_hooks: name → function of ``(gradient, hook)`` (or of the gradient
                alone) that returns ``None`` or the gradient to pass on instead; it acts
                when a backward pass reaches that activation of a run started inside the
                block with gradients enabled (:meth:`attnkit.nn.HookedModule.hooks`).
            fwd_hooks, bwd_hooks: TransformerLens' spellings of ``hooks`` and
                ``backward_hooks``.

        Yields:
            This model.

        Raises:
            ValueError: an unknown name (the message lists the names).
            TypeError: a value that is not callable, or a TransformerLens spelling given
                with attnkit's.
        """
        hooks = transformerlens_spelling(hooks, fwd_hooks, "hooks", "fwd_hooks")
        backward_hooks = transformerlens_spelling(backward_hooks, bwd_hooks, "backward_hooks", "bwd_hooks")
        with self.module.hooks(hooks or {}, backward_hooks=backward_hooks):
            yield self

    @overload
    def run_with_hooks(
        self,
        ids: Tensor,
        *,
        hooks: Hooks | None = None,
        names_filter: NameFilter = (),
        attention_mask: Tensor | None = None,
        logits: bool = True,
        backward_hooks: Hooks | None = None,
        fwd_hooks: Hooks | None = None,
        bwd_hooks: Hooks | None = None,
        incl_bwd: bool = False,
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
        return_type: Literal["run"] = "run",
    ) -> HookedRun: ...

    @overload
    def run_with_hooks(
        self,
        ids: Tensor,
        *,
        hooks: Hooks | None = None,
        names_filter: NameFilter = (),
        attention_mask: Tensor | None = None,
        logits: bool = True,
        backward_hooks: Hooks | None = None,
        fwd_hooks: Hooks | None = None,
        bwd_hooks: Hooks | None = None,
        incl_bwd: bool = False,
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
        return_type: ReturnType,
    ) -> Tensor | tuple[Tensor, Tensor] | None: ...

    @renamed_keywords(cache="names_filter", removed_in="0.3")
    def run_with_hooks(
        self,
        ids: Tensor,
        *,
        hooks: Hooks | None = None,
        names_filter: NameFilter = (),
        attention_mask: Tensor | None = None,
        logits: bool = True,
        backward_hooks: Hooks | None = None,
        fwd_hooks: Hooks | None = None,
        bwd_hooks: Hooks | None = None,
        incl_bwd: bool = False,
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
        return_type: ReturnType | Literal["run"] = "run",
    ) -> HookedRun | Tensor | tuple[Tensor, Tensor] | None:
        """A forward pass of a batch of ids through the hook points, in the caller's
        autograd mode (gradients flow when they are enabled): the building block of
        ablation, patching and gradient-based attributions.

        Args:
            ids: integer token ids ``[b, s]``, on any device (moved to the model's); with
                ``start_at_layer``, the residual stream ``[b, s, e]`` entering that layer.
            hooks: name → function, applied after those of enclosing :meth:`hooks` blocks.
            names_filter: the activations to return, as :meth:`run` takes them.
            attention_mask: ``[b, s]``, ``True`` (or 1) on tokens and ``False`` (0) on
                padding, on either side (:meth:`to_tokens` makes both); padding is never
                attended to, and a causal model counts each row's positions from its first
                token, so that a left-padded row gives its unpadded results.
            logits: compute the logits (a causal decoder) at every position; ``False`` leaves them
                ``None`` (a batch that needs a few positions' logits saves the vocabulary
                projection).
            backward_hooks: name → function of ``(gradient, hook)`` (or of the gradient)
                returning ``None`` or the gradient to pass on instead (TransformerLens'
                ``bwd_hooks``): it acts when the caller runs a backward pass through this
                run's outputs (``run.logits[..., t].sum().backward()``), with gradients
                enabled during the run.
            fwd_hooks, bwd_hooks: TransformerLens' spellings of ``hooks`` and
                ``backward_hooks`` (a list of ``(name or predicate, function)`` pairs, as
                both take).
            incl_bwd: also keep the gradients of the activations ``names_filter`` keeps,
                in ``run.cache.grads``, when the caller runs a backward pass through this
                run's outputs (:meth:`run_with_cache` with ``incl_bwd=True`` runs it).
            start_at_layer: run from this layer on (a causal decoder; negative from the
                end), ``ids`` being the residual stream into it, as TransformerLens'
                ``start_at_layer``: the layers before it do not run.
            stop_at_layer: end the pass before this layer (negative from the end;
                ``num_layers``: after the last layer, before the final norm): the result
                is the residual stream there ``[b, s, e]``, as TransformerLens'
                ``stop_at_layer``; the hooks and cache act up to that point.
            return_type: ``"run"`` returns the :class:`HookedRun`; TransformerLens'
                ``"logits"``, ``"loss"`` (the mean next-token loss, :meth:`loss_fn`),
                ``"both"`` (``(logits, loss)``) or ``None`` (nothing) return those.

        Returns:
            :class:`HookedRun` with the last hidden states ``[b', s, e]`` and logits
            ``[b', s, v]`` (``b'`` is ``b`` unless a hook changed the batch size), or
            what ``return_type`` asks for; with ``stop_at_layer``, the residual stream
            (in the run's ``last_hidden_state``, without logits).

        Raises:
            ValueError: ids not ``[b, s]`` (a residual not ``[b, s, e]``), too long,
                outside the vocabulary, an attention mask of another shape, an unknown
                hook or cache name, a layer out of range, ``start_at_layer`` on a model
                other than a causal decoder, a loss without ids or logits, an unknown
                ``return_type``.
        """
        hooks = transformerlens_spelling(hooks, fwd_hooks, "hooks", "fwd_hooks")
        backward_hooks = transformerlens_spelling(backward_hooks, bwd_hooks, "backward_hooks", "bwd_hooks")
        if return_type != "run":
            check_return_type(return_type)
        start = check_layer(start_at_layer, self.num_layers, "start_at_layer")
        stop = check_layer(stop_at_layer, self.num_layers, "stop_at_layer")
        if start is None:
            tokens, residual = ids, None
            padding = self._checked_batch(ids, attention_mask, names_filter=names_filter, logits=logits)
        else:
            tokens, residual = self._residual_shape(ids), ids  # [b, s] positions only, [b, s, e]
            padding = None if attention_mask is None else attention_mask.to(self.device).bool()  # [b, s]
        forward = self._forward(
            tokens,
            padding=padding,
            logits=logits,
            hooks=hooks,
            names_filter=names_filter,
            backward_hooks=backward_hooks,
            incl_bwd=incl_bwd,
            start_at_layer=0 if start is None else start,
            residual=residual,
            stop_at_layer=stop,
        )
        run = HookedRun(forward.out.output, forward.cache, forward.logits)  # [b, s, e], cache, [b, s, v] or None
        return self._returned(
            run, return_type, ids if start is None else None, attention_mask, stopped=stop is not None
        )

    def _checked_batch(
        self, ids: Tensor, attention_mask: Tensor | None, *, names_filter: NameFilter, logits: bool
    ) -> Tensor | None:
        """Check a batch of ids ``[b, s]`` for :meth:`run_with_hooks` (shape, vocabulary,
        length, the memory its run would need).

        Returns:
            The padding ``[b, s]`` bool on the model's device, or ``None`` without an
            attention mask.

        Raises:
            ValueError: ids not an integer tensor ``[b, s]``, an attention mask of another
                shape, and :meth:`prepare_input`'s and the memory check's errors.
        """
        if not isinstance(ids, Tensor) or ids.ndim != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            got = f"{ids.dtype} {list(ids.shape)}" if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(f"ids must be an integer tensor [b, s], got {got}")
        padding = None
        if attention_mask is not None:
            if not isinstance(attention_mask, Tensor) or attention_mask.shape != ids.shape:
                mask_got = (
                    list(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
                )
                raise ValueError(f"attention_mask must be [b, s] = {list(ids.shape)} like the ids, got {mask_got}")
            padding = attention_mask.to(self.device).bool()  # [b, s]
        for row in ids:
            self.prepare_input(row)
        b, s = ids.shape
        check_run_memory(
            self,
            [(b, s)],
            weight_layers=0,
            names_filter=names_filter,
            logits=logits,
            on=f"{b} × {s} tokens",
            advice="cache fewer activations (names_filter=), fewer or shorter texts",
        )
        return padding

    def _returned(
        self,
        run: HookedRun,
        return_type: ReturnType | Literal["run"],
        ids: Tensor | None,
        attention_mask: Tensor | None,
        *,
        stopped: bool,
    ) -> HookedRun | Tensor | tuple[Tensor, Tensor] | None:
        """What ``return_type`` asks of a run: the run, its logits, its loss, both, or
        nothing; a pass stopped before a layer gives its residual stream (as TL does)."""
        if return_type == "run":
            return run
        if stopped:
            return run.last_hidden_state  # [b, s, e]
        if return_type is None:
            return None
        if run.logits is None:
            raise ValueError(f"return_type={return_type!r} needs logits; {self.name} has no language-model head")
        if return_type == "logits":
            return run.logits
        if ids is None:
            raise ValueError(f"return_type={return_type!r} needs the token ids; a run from start_at_layer has none")
        loss = self.loss_fn(run.logits, ids, attention_mask=attention_mask)
        return loss if return_type == "loss" else (run.logits, loss)

    def _residual_shape(self, residual: Tensor) -> Tensor:
        """For :meth:`run_with_hooks` from a layer: zeros ``[b, s]`` in the shape of the
        residual stream ``[b, s, e]`` entering it (the network counts positions from them).

        Raises:
            ValueError: a model other than a causal decoder, a residual not ``[b, s, e]``.
        """
        if not isinstance(self.module, DecoderLM):
            raise ValueError(
                f"start_at_layer runs a causal decoder's layers; {self.name} is a {type(self.module).__name__}"
            )
        e = self.config.hidden_size
        if not isinstance(residual, Tensor) or residual.ndim != 3 or residual.shape[2] != e:
            got = list(residual.shape) if isinstance(residual, Tensor) else type(residual).__name__
            raise ValueError(f"with start_at_layer the input is the residual stream [b, s, e] with e = {e}, got {got}")
        return torch.zeros(residual.shape[:2], dtype=torch.long)  # [b, s]: the positions only

    @renamed_keywords(names="names_filter", removed_in="0.3")
    def run_with_cache(
        self,
        inputs: str | Sequence[str] | Tensor | Sequence[int],
        *,
        names_filter: NameFilter = None,
        attention_mask: Tensor | None = None,
        prepend_bos: bool | None = None,
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
        return_type: ReturnType = "logits",
        pos_slice: PositionSlice = None,
        incl_bwd: bool = False,
        metric: Callable[[Tensor], Tensor] | None = None,
    ) -> tuple[Any, ActivationCache]:
        """A forward pass that keeps activations, as TransformerLens' ``run_with_cache``;
        with ``incl_bwd``, a backward pass that keeps their gradients too.

        Args:
            inputs: a text, token ids ``[s]`` or ``[b, s]``, or several texts (padded on
                the right by :meth:`to_tokens`, and masked); with ``start_at_layer``, the
                residual stream ``[b, s, e]`` into that layer.
            names_filter: which activations: every one (``None``), names (:meth:`hook_names`), or
                a predicate on names.
            attention_mask: for ids ``[b, s]`` padded on either side, ``[b, s]`` ``True``
                on tokens (:meth:`to_tokens` returns it), as :meth:`run_with_hooks` takes
                it.
            prepend_bos: for texts, as :meth:`tokenize` takes it (``True``:
                TransformerLens' default).
            start_at_layer, stop_at_layer: as :meth:`run_with_hooks` takes them (a
                stopped pass returns the residual stream first).
            return_type: what comes first: ``"logits"``, ``"loss"``, ``"both"``
                (``(logits, loss)``) or ``None``, as in TransformerLens.
            pos_slice: keep only these positions of every activation (along its query
                positions), as TransformerLens' ``pos_slice``: an int (the dimension stays,
                of size 1), a slice or a list of positions.
            incl_bwd: run a backward pass from ``metric`` and keep the gradient of that
                scalar with respect to every kept activation in ``cache.grads``
                (:attr:`attnkit.nn.ActivationCache.grads`; ``cache[name + "_grad"]`` reads
                one too). The parameters' ``.grad`` are left as they are.
            metric: a function of the output (the logits ``[b, s, v]``, or BERT's hidden
                states) returning a scalar tensor; by default the mean next-token loss of
                the input (:meth:`loss_fn`, TransformerLens' loss), which an encoder
                without a language-model head does not have. ``incl_bwd`` takes none of
                ``start_at_layer``, ``stop_at_layer``, ``return_type`` and ``pos_slice``.

        Returns:
            ``(logits [b, s, v], cache)`` for a causal decoder, ``(hidden states [b, s, e],
            cache)`` for an encoder, in the model's dtype (or what ``return_type`` and
            ``stop_at_layer`` ask for first); the cache is an
            :class:`attnkit.nn.ActivationCache` (``cache["pattern", 3]`` looks a name up
            by its end and layer). Without autograd history, with ``incl_bwd`` too.

        Raises:
            TypeError, ValueError: inputs :meth:`run` or :meth:`to_tokens` refuse, an
                unknown name, a ``metric`` without ``incl_bwd``, with ``incl_bwd`` a metric
                that does not return a scalar or no metric for an encoder.
        """
        mask = None
        if attention_mask is not None and not (isinstance(inputs, Tensor) and inputs.ndim == 2):
            raise ValueError(
                "attention_mask goes with ids [b, s]; texts are padded and masked by run_with_cache itself"
            )
        if isinstance(inputs, str):
            ids = self.prepare_input(inputs, prepend_bos=prepend_bos)[0]  # [1, s]
        elif isinstance(inputs, Sequence) and inputs and all(isinstance(t, str) for t in inputs):
            ids, mask = self.to_tokens(list(inputs), prepend_bos=prepend_bos)  # type: ignore[arg-type]
        elif isinstance(inputs, Tensor) and (inputs.ndim == 2 or start_at_layer is not None):
            ids, mask = inputs, attention_mask
        else:
            ids = self.prepare_input(inputs)[0]  # type: ignore[arg-type]
        check_return_type(return_type)
        if incl_bwd:
            if (start_at_layer, stop_at_layer, return_type, pos_slice) != (None, None, "logits", None):
                raise ValueError("incl_bwd=True takes none of start_at_layer, stop_at_layer, return_type and pos_slice")
            return self._run_with_gradients(ids, mask, names_filter, metric)
        if metric is not None:
            raise ValueError("metric= is the scalar whose gradients incl_bwd=True keeps; pass incl_bwd=True with it")
        with torch.no_grad():
            run = self.run_with_hooks(
                ids,
                names_filter=names_filter,
                attention_mask=mask,
                start_at_layer=start_at_layer,
                stop_at_layer=stop_at_layer,
            )
        assert isinstance(run, HookedRun)  # return_type "run"
        cache = sliced_positions(run.cache, self.module.hook_points(), pos_slice)
        if run.logits is None and return_type == "logits":  # an encoder, or a stopped pass
            return run.last_hidden_state, cache
        stopped = stop_at_layer is not None
        return self._returned(
            run, return_type, None if start_at_layer is not None else ids, mask, stopped=stopped
        ), cache

    def _run_with_gradients(
        self,
        ids: Tensor,
        mask: Tensor | None,
        names_filter: NameFilter,
        metric: Callable[[Tensor], Tensor] | None,
    ) -> tuple[Tensor, ActivationCache]:
        """:meth:`run_with_cache` with ``incl_bwd``: the pass with gradients enabled, the
        backward pass from ``metric`` (by default the next-token loss), detached results."""
        with torch.enable_grad():
            run = self.run_with_hooks(ids, names_filter=names_filter, attention_mask=mask, incl_bwd=True)
            output = run.last_hidden_state if run.logits is None else run.logits
            if metric is None and run.logits is None:
                raise ValueError(
                    f"{self.name} has no language-model head: there is no loss to run the backward pass from; pass "
                    "metric= (a function of the hidden states returning a scalar)"
                )
            scalar = lm_cross_entropy(output, ids, attention_mask=mask) if metric is None else metric(output)
            backward_of_scalar(scalar, run.cache)
        run.cache.detach_entries()
        return output.detach(), run.cache

    def add_hook(self, name: str, hook: HookFn) -> None:
        """A permanent hook on ``name``, kept until :meth:`reset_hooks`
        (:meth:`attnkit.nn.HookedModule.add_hook`): it acts on every run, batch and
        generation of this model, before the hooks of any ``with model.hooks(...)`` block.

        Raises:
            ValueError: an unknown name (the message lists the names).
            TypeError: a hook that is not callable.
        """
        self.module.add_hook(name, hook)

    def reset_hooks(self) -> None:
        """Remove every permanent hook of this model."""
        self.module.reset_hooks()


def transformerlens_spelling(given: Hooks | None, tl_given: Hooks | None, name: str, tl_name: str) -> Hooks | None:
    """The hooks given under attnkit's keyword or TransformerLens' (``fwd_hooks``,
    ``bwd_hooks``).

    Raises:
        TypeError: both given.
    """
    if given and tl_given:
        raise TypeError(f"{tl_name}= is TransformerLens' spelling of {name}=: give one of them")
    return tl_given or given
