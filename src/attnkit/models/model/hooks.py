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
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Self

import torch
from torch import Tensor

from attnkit.deprecation import renamed_keywords
from attnkit.models.checkpoints.memory import check_run_memory
from attnkit.models.model.core import ModelCore
from attnkit.models.model.lens import lm_cross_entropy
from attnkit.models.model.runs import HookedRun
from attnkit.nn import ActivationCache
from attnkit.nn.hooks import HookFn, NameFilter, backward_of_scalar
from attnkit.nn.text_module import TextModule


class HooksMixin(ModelCore):
    """The hook API over the attributes below.

    Attributes (what the mixin reads of its class):
        name: for messages.
        module: the network, whose hook points the runs go through.
    """

    name: str
    module: TextModule

    if TYPE_CHECKING:  # what other mixins define

        def to_tokens(
            self, texts: str | Sequence[str], *, padding_side: Literal["right", "left"] = "right"
        ) -> tuple[Tensor, Tensor]: ...

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
        self, hooks: Mapping[str, HookFn], *, backward_hooks: Mapping[str, HookFn] | None = None
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
                use instead. Nested blocks apply the outer block's hooks first.
            backward_hooks: name → function of ``(gradient, hook)`` (or of the gradient
                alone) that returns ``None`` or the gradient to pass on instead; it acts
                when a backward pass reaches that activation of a run started inside the
                block with gradients enabled (:meth:`attnkit.nn.HookedModule.hooks`).

        Yields:
            This model.

        Raises:
            ValueError: an unknown name (the message lists the names).
            TypeError: a value that is not callable.
        """
        with self.module.hooks(hooks, backward_hooks=backward_hooks):
            yield self

    @renamed_keywords(cache="names_filter", removed_in="0.3")
    def run_with_hooks(
        self,
        ids: Tensor,
        *,
        hooks: Mapping[str, HookFn] | None = None,
        names_filter: NameFilter = (),
        attention_mask: Tensor | None = None,
        logits: bool = True,
        backward_hooks: Mapping[str, HookFn] | None = None,
        incl_bwd: bool = False,
    ) -> HookedRun:
        """A forward pass of a batch of ids through the hook points, in the caller's
        autograd mode (gradients flow when they are enabled): the building block of
        ablation, patching and gradient-based attributions.

        Args:
            ids: integer token ids ``[b, s]``, on any device (moved to the model's).
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
            incl_bwd: also keep the gradients of the activations ``names_filter`` keeps,
                in ``run.cache.grads``, when the caller runs a backward pass through this
                run's outputs (:meth:`run_with_cache` with ``incl_bwd=True`` runs it).

        Returns:
            :class:`HookedRun` with the last hidden states ``[b', s, e]`` and logits
            ``[b', s, v]`` (``b'`` is ``b`` unless a hook changed the batch size).

        Raises:
            ValueError: ids not ``[b, s]``, too long, outside the vocabulary, an attention
                mask of another shape, or an unknown hook or cache name.
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
        forward = self._forward(
            ids,
            padding=padding,
            logits=logits,
            hooks=hooks,
            names_filter=names_filter,
            backward_hooks=backward_hooks,
            incl_bwd=incl_bwd,
        )
        return HookedRun(forward.out.output, forward.cache, forward.logits)  # [b, s, e], cache, [b, s, v] or None

    @renamed_keywords(names="names_filter", removed_in="0.3")
    def run_with_cache(
        self,
        inputs: str | Sequence[str] | Tensor | Sequence[int],
        *,
        names_filter: NameFilter = None,
        attention_mask: Tensor | None = None,
        incl_bwd: bool = False,
        metric: Callable[[Tensor], Tensor] | None = None,
    ) -> tuple[Tensor, ActivationCache]:
        """A forward pass that keeps activations, as TransformerLens' ``run_with_cache``;
        with ``incl_bwd``, a backward pass that keeps their gradients too.

        Args:
            inputs: a text, token ids ``[s]`` or ``[b, s]``, or several texts (padded on
                the right by :meth:`to_tokens`, and masked).
            names_filter: which activations: every one (``None``), names (:meth:`hook_names`), or
                a predicate on names.
            attention_mask: for ids ``[b, s]`` padded on either side, ``[b, s]`` ``True``
                on tokens (:meth:`to_tokens` returns it), as :meth:`run_with_hooks` takes
                it.
            incl_bwd: run a backward pass from ``metric`` and keep the gradient of that
                scalar with respect to every kept activation in ``cache.grads``
                (:attr:`attnkit.nn.ActivationCache.grads`; ``cache[name + "_grad"]`` reads
                one too). The parameters' ``.grad`` are left as they are.
            metric: a function of the output (the logits ``[b, s, v]``, or BERT's hidden
                states) returning a scalar tensor; by default the mean next-token loss of
                the input (:meth:`loss_fn`, TransformerLens' loss), which an encoder
                without a language-model head does not have.

        Returns:
            ``(logits [b, s, v], cache)`` for a causal decoder, ``(hidden states [b, s, e],
            cache)`` for an encoder, in the model's dtype; the cache is an
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
            ids = self.prepare_input(inputs)[0]  # [1, s]
        elif isinstance(inputs, Sequence) and inputs and all(isinstance(t, str) for t in inputs):
            ids, mask = self.to_tokens(list(inputs))  # type: ignore[arg-type]
        elif isinstance(inputs, Tensor) and inputs.ndim == 2:
            ids, mask = inputs, attention_mask
        else:
            ids = self.prepare_input(inputs)[0]  # type: ignore[arg-type]
        if incl_bwd:
            return self._run_with_gradients(ids, mask, names_filter, metric)
        if metric is not None:
            raise ValueError("metric= is the scalar whose gradients incl_bwd=True keeps; pass incl_bwd=True with it")
        with torch.no_grad():
            run = self.run_with_hooks(ids, names_filter=names_filter, attention_mask=mask)
        return (run.last_hidden_state if run.logits is None else run.logits), run.cache

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
