"""Hook points: named places inside the :mod:`attnkit.nn` modules where a function may read
or replace an activation during a forward pass, and where an activation cache records it.

A :class:`HookPoint` is an identity placed at one activation of a module (in the spirit of
TransformerLens' ``HookPoint``). Its name is its path in the module tree, so the names of a
model are those of ``model.named_modules()``: ``decoder.layers.3.self_attn.pattern`` is the
attention pattern of the self-attention ``decoder.layers.3.self_attn``. Every module that
holds hook points calls them in its one forward pass: plain calls, batches, cached
generation and training all meet the same points. With no hook and no cache active, a
point costs one context-variable read and the module runs its fused path unchanged
(attention never materialises its weights, per-head results and norm scales are not
computed). With a cache and no hook on them, a pass without gradients (under
:func:`torch.no_grad`, as ``Model.run_with_cache`` runs, not :func:`torch.inference_mode`)
and without a KV cache leaves an attention layer's ``scores``, ``pattern`` and ``result``
to be computed from its recorded queries and keys (or head outputs) when the cache is
first read (:class:`attnkit.nn.activation_cache.DeferredActivations`), and still runs the
fused path.

Any module that contains hook points and derives from :class:`HookedModule` (every
stack and model of :mod:`attnkit.nn`, and the checkpoints of :mod:`attnkit.models`) has
:meth:`~HookedModule.hook_names`, :meth:`~HookedModule.hooks`,
:meth:`~HookedModule.run_with_hooks` and :meth:`~HookedModule.run_with_cache`.

Hooks of a :meth:`~HookedModule.hooks` block live in a context variable: they act in that
block, in that thread, and nothing is left behind. A permanent hook
(:meth:`~HookedModule.add_hook`, TransformerLens' ``add_hook``) is kept on its point and
acts on every forward pass, in every thread, before the hooks of any block, until
:meth:`~HookedModule.reset_hooks` removes it.

The points, by the module that holds them (shape letters: ``b`` batch, ``h`` query heads,
``h_kv`` key/value heads, ``s`` query positions, ``s_k`` key positions (cached ones
included), ``d`` head dim, ``e`` model dim, ``f`` feed-forward hidden dim):

=============================  ======================  =============================================================
point                          shape                   what
=============================  ======================  =============================================================
*MultiHeadAttention*
``q_unrotated``                ``[b, h, s, d]``        queries per head before the rotary encoding (rotary only)
``k_unrotated``                ``[b, h_kv, s, d]``     new keys per key/value head before it (rotary only)
``q``                          ``[b, h, s, d]``        queries per head, after the rotary encoding
``k``                          ``[b, h_kv, s, d]``     new keys per key/value head, after the rotary encoding
``v``                          ``[b, h_kv, s, d]``     new values per key/value head
``scores``                     ``[b, h, s, s_k]``      pre-softmax scores: scaled, biased, ``-inf`` where masked
``pattern``                    ``[b, h, s, s_k]``      attention weights after the softmax, queries as rows
``z``                          ``[b, h, s, d]``        each head's output, before the output projection
``result``                     ``[b, h, s, e]``        each head's output after its slice of the output projection
*FeedForward*
``pre``                        ``[b, s, f]``           hidden pre-activation (SwiGLU: the gate's)
``post``                       ``[b, s, f]``           hidden activation, what the down projection reads
*RMSNorm*, *LayerNorm*
``scale``                      ``[b, s, 1]``           ``sqrt(mean(x²) + eps)`` (RMS) or ``sqrt(var(x) + eps)``
*EncoderLayer*, *DecoderLayer*
``resid_pre``                  ``[b, s, e]``           the residual stream into the layer
``attn_out``                   ``[b, s, e]``           the self-attention block's output
``resid_mid``                  ``[b, s, e]``           the stream after self-attention (normalised in post-norm)
``cross_attn_out``             ``[b, s, e]``           the cross-attention block's output (decoder layers with one)
``resid_mid_cross``            ``[b, s, e]``           the stream after cross-attention (idem)
``mlp_out``                    ``[b, s, e]``           the feed-forward block's output
``resid_post``                 ``[b, s, e]``           the residual stream out of the layer (normalised in post-norm)
*Encoder*, *Decoder*
``final``                      ``[b, s, e]``           the stack's output, after its final norm
*DecoderLM*, BERT, *SequenceEmbedding*
``embed``                      ``[b, s, e]``           the embeddings as they enter the first layer
=============================  ======================  =============================================================

In a :class:`attnkit.nn.DecoderLM` layer 3's pattern is ``decoder.layers.3.self_attn.pattern``
and its MLP activation ``decoder.layers.3.ff.post``; in a :class:`attnkit.nn.Transformer`
the decoder's cross-attention pattern is ``decoder.layers.3.cross_attn.pattern``; an
:class:`attnkit.nn.EncoderDecoderLM` adds ``source_embedding.embed`` and
``target_embedding.embed``. The
points named ``scores`` and ``pattern`` exist only with the ``"auto"`` kernel (the others
never form the weights), ``cross_attn_out`` and ``resid_mid_cross`` only in layers with
cross-attention, ``q_unrotated`` and ``k_unrotated`` only where a rotary encoding turns
the queries and keys (elsewhere ``q`` and ``k`` are the projections themselves).

TransformerLens' names (``blocks.3.attn.hook_z``, ``blocks.3.hook_resid_pre``,
``ln_final.hook_scale``, ...) are aliases of these points wherever a name is taken, the
per-head activations then in TransformerLens' layout, positions before heads
(:mod:`attnkit.nn.transformerlens_names`).

A hook is a function of ``(activation, hook)`` (two required positional arguments) or of
the activation alone, that returns
``None`` (it only reads) or a tensor that replaces the activation; ``hook`` is the
:class:`HookPoint`, with :attr:`HookPoint.name` and :attr:`HookPoint.layer`. A replacement
keeps every dimension but the batch (a hook may add rows, to run variants side by side).
A replaced ``scores`` goes through the softmax as it is; a replaced ``pattern`` multiplies
the values; a replaced ``result`` is summed over heads (plus the output bias) into
``attn_out``; a replaced ``scale`` divides the centred (LayerNorm) or raw (RMSNorm) input.
Hooks that return their input (or ``None``) change nothing, bit for bit.

Gradients: a backward hook (``backward_hooks=`` of :meth:`~HookedModule.hooks`,
:meth:`~HookedModule.run_with_hooks` and :meth:`~HookedModule.hook_session`) is a function
of ``(gradient, hook)`` or of the gradient alone, returning ``None`` or the gradient to pass
on (shaped like it). It is registered on the activation of every pass run inside its block
with gradients enabled, and runs when a backward pass reaches that activation, inside the
block or after it. A cache asked for gradients (``incl_bwd=True``) keeps each kept
activation's gradient in :attr:`attnkit.nn.ActivationCache.grads` the same way (after the
backward hooks); :meth:`~HookedModule.run_with_cache` with ``incl_bwd=True`` runs the
backward pass itself. While a point's gradient is watched (:attr:`HookPoint.watches_gradient`)
its module computes what follows from the activation itself: attention multiplies the
``pattern`` with the values, the output sums the per-head ``result``, a norm divides by its
``scale``, and none of these is left to a cache to compute later, so that the gradient at
the point is the one through everything after it. An activation with no autograd history
(parameters that want no gradient) is made to want one. Points without backward hooks or
gradient caches cost nothing more.

With a KV cache (generation), each decoding step calls every point once: ``q``, ``k``,
``v``, ``z`` and the residual points see the new positions only (``s = 1`` after the
prompt), and a replaced ``k`` or ``v`` is what the cache keeps; ``scores`` and ``pattern``
are ``[b, h, 1, s_k]`` over every cached position. Cross-attention projects its keys and
values once, on the first step: its ``k`` and ``v`` are called on that step only.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor, nn
from torch.nn.modules.module import register_module_module_registration_hook

from attnkit.deprecation import renamed_keywords
from attnkit.nn.activation_cache import LAYER_INDEX
from attnkit.nn.transformerlens_names import TransformerLensHook, TransformerLensName, transformerlens_aliases

if TYPE_CHECKING:
    from attnkit.nn.activation_cache import ActivationCache, DeferredActivations

HookFn = Callable[..., "Tensor | None"]
HookCall = Callable[["Tensor", "HookPoint"], "Tensor | None"]
# Which activations a cache keeps: every one (``None``), one name, these names, or the names a
# predicate accepts.
NameFilter = str | Collection[str] | Callable[[str], bool] | None
# Hooks: name (attnkit's or TransformerLens') → function, or TransformerLens' list of
# ``(name or predicate on names, function)`` pairs (``fwd_hooks=[(name, fn)]``).
Hooks = Mapping[str, HookFn] | Sequence[tuple["str | Callable[[str], bool]", HookFn]]

_Root = TypeVar("_Root", bound="HookedModule")


class HookPoint(nn.Module):
    """An identity on one activation, where hooks and caches act.

    Modules call it on the activation; it returns the activation, or what the active hooks
    replaced it with. Calling it skips ``nn.Module``'s hook machinery (a point is called
    hundreds of times per forward pass): use :meth:`HookedModule.hooks`, not
    ``register_forward_hook``, to act on it.

    Args:
        positions: the dimensions of the activation that run along token positions (the
            query and key dimensions of ``pattern``), used to cut padding off a batch.

    Attributes:
        name: its path from the module whose :meth:`HookedModule.hook_names` or hooks were
            last asked for (``""`` before).
        layer: the layer index in ``name`` (``layers.N.``), or ``None``.
        positions: as given.
    """

    def __init__(self, *, positions: tuple[int, ...] = (1,)) -> None:
        super().__init__()
        self.name = ""
        self.layer: int | None = None
        self.positions = positions
        self.permanent: tuple[Callable[[Tensor, HookPoint], Tensor | None], ...] = ()

    def forward(self, activation: Tensor) -> Tensor:
        """The activation, after this point's permanent hooks and the active hooks on it
        (and recorded by the active caches that ask for it)."""
        session = _SESSION.get()
        if session is None:
            return activation if not self.permanent else _apply_hooks(self, self.permanent, activation)
        return session.apply(self, activation)

    __call__ = forward

    @property
    def active(self) -> bool:
        """Whether a hook or a cache is on this point now: modules compute what only a
        hook needs (weights, per-head results, norm scales) only then."""
        if self.permanent:
            return True
        session = _SESSION.get()
        return session is not None and session.wants(self)

    @property
    def hooked(self) -> bool:
        """Whether a hook (not only a cache) is on this point now, or its gradient is
        watched (:attr:`watches_gradient`): its activation must then be formed during the
        forward pass, since the hook may replace it or the gradient flows through it."""
        if self.permanent:
            return True
        session = _SESSION.get()
        return session is not None and (self in session.hooks or self.watches_gradient)

    @property
    def watches_gradient(self) -> bool:
        """Whether a backward hook or a gradient cache is on this point in a pass that
        records gradients: the module must then compute what follows from this activation
        itself (not from a fused path beside it), so that the gradient flows through it."""
        session = _SESSION.get()
        return session is not None and torch.is_grad_enabled() and session.watches_gradient(self)

    def extra_repr(self) -> str:
        return repr(self.name) if self.name else ""


@dataclass(frozen=True)
class _Session:
    """The hooks and caches active in one context: point → hook functions (outer blocks'
    first), the caches with the points each records (point → its name), point → backward
    hook functions, and the caches that record gradients with their points."""

    hooks: Mapping[HookPoint, tuple[Callable[[Tensor, HookPoint], Tensor | None], ...]]
    caches: tuple[tuple[Mapping[HookPoint, str], ActivationCache], ...]
    backward_hooks: Mapping[HookPoint, tuple[Callable[[Tensor, HookPoint], Tensor | None], ...]] = field(
        default_factory=dict
    )
    gradient_caches: tuple[tuple[Mapping[HookPoint, str], ActivationCache], ...] = ()

    def wants(self, point: HookPoint) -> bool:
        return point in self.hooks or any(point in names for names, _ in self.caches) or self.watches_gradient(point)

    def watches_gradient(self, point: HookPoint) -> bool:
        return point in self.backward_hooks or any(point in names for names, _ in self.gradient_caches)

    def apply(self, point: HookPoint, activation: Tensor) -> Tensor:
        activation = _apply_hooks(point, point.permanent + self.hooks.get(point, ()), activation)
        if torch.is_grad_enabled() and self.watches_gradient(point):
            activation = self._watch_gradient(point, activation)
        for names, cache in self.caches:
            name = names.get(point)
            if name is not None:
                cache[name] = activation
        return activation

    def _watch_gradient(self, point: HookPoint, activation: Tensor) -> Tensor:
        """Register what runs on the gradient of ``activation`` when a backward pass
        reaches it: the backward hooks in order (each may replace it), then the gradient
        caches record it. An activation that carries no autograd history (the model's
        parameters want no gradient) is made to want one, so that the pass records what
        follows it; one that cannot (integer indices) is left as it is."""
        if not (activation.is_floating_point() or activation.is_complex()):
            return activation
        if not activation.requires_grad:
            activation = activation.detach().requires_grad_()
        backward = self.backward_hooks.get(point, ())
        recorders = [(names[point], cache) for names, cache in self.gradient_caches if point in names]

        def on_gradient(gradient: Tensor) -> Tensor:
            gradient = _apply_hooks(point, backward, gradient)
            for name, cache in recorders:
                cache.grads[name] = gradient
            return gradient

        activation.register_hook(on_gradient)
        return activation


def record_on_read(
    points: Sequence[HookPoint], deferred: DeferredActivations, handed_out_by: Sequence[HookPoint] = ()
) -> None:
    """Let the active caches keep the activations of ``points`` as ``deferred`` computes
    them, when first read, rather than forming them now. For points a cache keeps and no
    hook is on (:attr:`HookPoint.hooked`); a point no active cache keeps is left out.

    Args:
        points: the points, in the order of the activations ``deferred`` computes.
        deferred: the computation (:class:`attnkit.nn.activation_cache.DeferredActivations`).
        handed_out_by: the points whose activations may hold ``deferred``'s inputs (the
            layer's ``q``, ``k`` and ``v``: its queries and keys, or tensors sharing their
            memory). A hook on one of them may keep what it saw: ``deferred`` copies its
            inputs now. A cache keeping one copies the inputs sharing its memory before
            first handing it out.
    """
    session = _SESSION.get()
    if session is None:
        return
    for names, cache in session.caches:
        kept = {names[point]: index for index, point in enumerate(points) if point in names}
        if kept:
            cache.add_computed_on_read(kept, deferred)
    if any(point.hooked for point in handed_out_by):
        deferred.keep_copies()
        return
    for point in handed_out_by:
        for names, cache in session.caches:
            name = names.get(point)
            if name is not None:
                cache.share_memory(name, deferred)


def _apply_hooks(
    point: HookPoint, hooks: Sequence[Callable[[Tensor, HookPoint], Tensor | None]], activation: Tensor
) -> Tensor:
    """``activation`` through ``hooks`` in order, each replacement checked."""
    for fn in hooks:
        replaced = fn(activation, point)
        if replaced is not None:
            if not isinstance(replaced, Tensor) or replaced.shape[1:] != activation.shape[1:]:
                got = list(replaced.shape) if isinstance(replaced, Tensor) else type(replaced).__name__
                raise ValueError(
                    f"hook on {point.name!r} must return None or a tensor shaped like its input "
                    f"[b, {', '.join(map(str, activation.shape[1:]))}], got {got}"
                )
            activation = replaced
    return activation


_SESSION: contextvars.ContextVar[_Session | None] = contextvars.ContextVar("attnkit_hooks", default=None)

# Module → (registrations counted when its map was built, name → (point, layer index)).
_POINT_MAPS: weakref.WeakKeyDictionary[nn.Module, tuple[int, dict[str, tuple[HookPoint, int | None]]]] = (
    weakref.WeakKeyDictionary()
)


class _Registrations:
    """How many submodules were registered anywhere in this process (torch's global
    registration hook counts them): a map of hook points built before the last one may
    name a module tree that has changed since."""

    count = 0
    # The module whose map last named the points (HookPoint.name, HookPoint.layer), weakly.
    named_by: weakref.ref[nn.Module] | None = None


def _count_registration(module: nn.Module, name: str, submodule: nn.Module | None) -> None:
    _Registrations.count += 1


register_module_module_registration_hook(_count_registration)


class HookedModule(nn.Module):
    """A module whose hook points can be named, hooked and cached (a mixin of every
    :mod:`attnkit.nn` stack and model). Hooks are active in the ``with`` block that
    installed them, in that thread (a context variable, not state on the module), for
    every forward pass of this module and of its submodules.
    """

    def hook_points(self) -> dict[str, HookPoint]:
        """Every hook point under this module by name (its path from here), in module
        order; names each point (:attr:`HookPoint.name`, :attr:`HookPoint.layer`).

        The map is built by walking the module tree at first use and kept (a cache read
        such as ``cache["pattern", 3]`` looks names up in it); it is built again after any
        module registers a submodule (attribute assignment, ``add_module``, a container's
        ``append``, ``extend`` or item assignment). A change that registers nothing —
        ``del`` of a submodule, ``nn.ModuleList.insert``, editing ``_modules`` — is seen
        after :meth:`forget_hook_points`."""
        known = _POINT_MAPS.get(self)
        if known is None or known[0] != _Registrations.count:
            points = {}
            for name, module in self.named_modules():
                if isinstance(module, HookPoint):
                    match = LAYER_INDEX.search(name)
                    points[name] = (module, int(match.group(1)) if match else None)
            known = (_Registrations.count, points)
            _POINT_MAPS[self] = known
            _Registrations.named_by = None
        if _Registrations.named_by is None or _Registrations.named_by() is not self:
            # The points carry the names another module (or an older map) gave them.
            for name, (point, layer) in known[1].items():
                point.name, point.layer = name, layer
            _Registrations.named_by = weakref.ref(self)
        return {name: point for name, (point, _) in known[1].items()}

    def forget_hook_points(self) -> None:
        """Walk the module tree again at the next :meth:`hook_points`: after a change to it
        that registers no submodule (``del`` of a submodule, ``nn.ModuleList.insert``)."""
        _POINT_MAPS.pop(self, None)
        _Registrations.named_by = None

    def hook_names(self) -> list[str]:
        """The names of :meth:`hook_points`, e.g. ``decoder.layers.0.self_attn.pattern``."""
        return list(self.hook_points())

    def hook_name(self, name: str, layer: int | None = None) -> str:
        """The full name of a point given by the end of its name and its layer:
        ``hook_name("self_attn.z", 3)`` is ``"decoder.layers.3.self_attn.z"`` in a
        :class:`attnkit.nn.DecoderLM`.

        Args:
            name: the full name, or its last parts (``"z"``, ``"self_attn.z"``,
                ``"final"``).
            layer: the layer index (negative from the end), or ``None`` for a point
                outside the layers.

        Returns:
            The one name that matches.

        Raises:
            ValueError: no point matches, or several do (the message lists them).
        """
        points = self.hook_points()
        if layer is not None and layer < 0:
            layer += 1 + max((p.layer for p in points.values() if p.layer is not None), default=-1)
        found = [
            full
            for full, point in points.items()
            if point.layer == layer and (full == name or full.endswith("." + name))
        ]
        if len(found) != 1:
            where = "" if layer is None else f" in layer {layer}"
            problem = f"matches several points ({', '.join(found)})" if found else "matches no point"
            raise ValueError(f"hook name {name!r}{where} {problem}; the names are {summarize_names(points)}")
        return found[0]

    def add_hook(self, name: str, hook: HookFn) -> None:
        """Install a permanent hook: it acts on every forward pass of this module, in every
        thread, until :meth:`reset_hooks` (TransformerLens' ``add_hook``), before the hooks
        of any :meth:`hooks` block. Prefer :meth:`hooks` where a ``with`` block fits: it
        cannot be left behind.

        Args:
            name: a name of :meth:`hook_names`.
            hook: a function of ``(activation, hook)`` or of the activation, as
                :meth:`hooks` takes it.

        Raises:
            ValueError: an unknown name (the message lists the names).
            TypeError: a hook that is not callable.
        """
        points = self.hook_points()
        check_hook_names([name], points, "hook")
        if not callable(hook):
            raise TypeError(f"the hook on {name!r} must be a function of the activation, got {type(hook).__name__}")
        point, hook_fn = _hook_on(name, hook, points)
        point.permanent = (*point.permanent, hook_fn)

    def reset_hooks(self) -> None:
        """Remove every permanent hook (:meth:`add_hook`) under this module."""
        for point in self.hook_points().values():
            point.permanent = ()

    def permanent_hooks(self) -> dict[str, int]:
        """The points that have permanent hooks, with how many each has."""
        return {name: len(point.permanent) for name, point in self.hook_points().items() if point.permanent}

    def run_with_hooks(
        self,
        *args: Any,
        hooks: Hooks | None = None,
        backward_hooks: Hooks | None = None,
        **kwargs: Any,
    ) -> Any:
        """This module's forward pass on ``args`` / ``kwargs`` with ``hooks`` active, and
        ``backward_hooks`` registered on the gradients of its activations (they act when
        the caller runs a backward pass through the output, after this call returns).

        Raises:
            ValueError: an unknown name.
            TypeError: a hook that is not callable.
        """
        with self.hooks(hooks or {}, backward_hooks=backward_hooks):
            return self(*args, **kwargs)

    @renamed_keywords(names="names_filter", removed_in="0.3")
    def run_with_cache(
        self,
        *args: Any,
        names_filter: NameFilter = None,
        incl_bwd: bool = False,
        metric: Callable[[Any], Tensor] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ActivationCache]:
        """This module's forward pass on ``args`` / ``kwargs``, keeping activations (and,
        with ``incl_bwd``, their gradients).

        Args:
            args, kwargs: what the forward pass takes.
            names_filter: which activations: every one (``None``), a collection of names, or a
                predicate on names (``lambda name: name.endswith("pattern")``).
            incl_bwd: also run a backward pass from ``metric`` of the output (from the
                output itself when ``metric`` is ``None``: it must then be a scalar) and keep
                the gradient of that scalar with respect to each kept activation in
                ``cache.grads`` (:attr:`attnkit.nn.ActivationCache.grads`); the parameters'
                ``.grad`` are left as they are. The output and the cache's tensors come back
                detached.
            metric: a function of the output returning a scalar tensor, for ``incl_bwd``.

        Returns:
            ``(output of the forward pass, ActivationCache)``.

        Raises:
            ValueError: an unknown name, a metric without ``incl_bwd``, or with ``incl_bwd``
                a scalar that is not one (a tensor of one element).
        """
        if metric is not None and not incl_bwd:
            raise ValueError("metric= is the scalar whose gradients incl_bwd=True keeps; pass incl_bwd=True with it")
        with self.hook_session(names_filter=names_filter, incl_bwd=incl_bwd) as cache:
            out = self(*args, **kwargs)
        if incl_bwd:
            backward_of_scalar(out if metric is None else metric(out), cache)
            cache.detach_entries()
            out = out.detach() if isinstance(out, Tensor) else out
        return out, cache

    @contextlib.contextmanager
    def hooks(self: _Root, hooks: Hooks, *, backward_hooks: Hooks | None = None) -> Iterator[_Root]:
        """Install functions that read or replace activations in every forward pass of this
        module inside the ``with`` block (in this thread), and functions on their gradients.

        Args:
            hooks: name (:meth:`hook_names`) → function of ``(activation, hook)`` or of the
                activation, returning ``None`` or the tensor to use instead. Nested blocks
                apply the outer block's hooks first.
            backward_hooks: name → function of ``(gradient, hook)`` or of the gradient,
                returning ``None`` or the gradient to pass on instead: registered on the
                activation of every forward pass inside the block that records gradients,
                it acts when a backward pass reaches that activation, inside the block or
                after it (TransformerLens' ``bwd_hooks``).

        Yields:
            This module.

        Raises:
            ValueError: an unknown name (the message lists the names).
            TypeError: a value that is not callable.
        """
        with self.hook_session(hooks, backward_hooks=backward_hooks):
            yield self

    @renamed_keywords(cache="names_filter", removed_in="0.3")
    @contextlib.contextmanager
    def hook_session(
        self,
        hooks: Hooks | None = None,
        *,
        names_filter: NameFilter = (),
        backward_hooks: Hooks | None = None,
        incl_bwd: bool = False,
    ) -> Iterator[ActivationCache]:
        """Hooks and a cache, active inside the ``with`` block (in this thread).

        Args:
            hooks: as :meth:`hooks` takes them.
            names_filter: the activations to keep, as :meth:`run_with_cache` takes them; ``()``
                keeps none.
            backward_hooks: as :meth:`hooks` takes them.
            incl_bwd: also keep the gradients of the kept activations, in the cache's
                :attr:`~attnkit.nn.ActivationCache.grads`, when a backward pass reaches them
                (passes inside the block that record gradients).

        Yields:
            The :class:`attnkit.nn.ActivationCache`, filled as forward passes run.

        Raises:
            ValueError: an unknown name.
            TypeError: a hook that is not callable.
        """
        from attnkit.nn.activation_cache import ActivationCache

        if not hooks and not backward_hooks and names_filter == ():
            # Nothing to add: no walk over the module tree, the context stays as it is.
            yield ActivationCache(self)
            return
        points = self.hook_points()
        outer = _SESSION.get()
        chains = _hook_chains(hooks, points, outer.hooks if outer else {}, "hook")
        backward_chains = _hook_chains(backward_hooks, points, outer.backward_hooks if outer else {}, "backward hook")
        cached = cached_points(names_filter, points)
        activation_cache = ActivationCache(self)
        caches = outer.caches if outer else ()
        gradient_caches = outer.gradient_caches if outer else ()
        if cached:
            caches = (*caches, (cached, activation_cache))
            if incl_bwd:
                gradient_caches = (*gradient_caches, (cached, activation_cache))
        active = chains or caches or backward_chains
        token = _SESSION.set(_Session(chains, caches, backward_chains, gradient_caches) if active else None)
        try:
            yield activation_cache
        finally:
            _SESSION.reset(token)


def _hook_chains(
    hooks: Hooks | None,
    points: Mapping[str, HookPoint],
    outer: Mapping[HookPoint, tuple[Callable[[Tensor, HookPoint], Tensor | None], ...]],
    what: str,
) -> dict[HookPoint, tuple[Callable[[Tensor, HookPoint], Tensor | None], ...]]:
    """Point → the hook functions on it: the outer block's, then ``hooks``, checked.

    Raises:
        ValueError: an unknown name.
        TypeError: a value that is not callable, an entry that is not a pair.
    """
    pairs = named_hooks(hooks, points, what)
    check_hook_names([name for name, _ in pairs], points, what)
    chains = dict(outer)
    for name, fn in pairs:
        if not callable(fn):
            raise TypeError(f"the {what} on {name!r} must be a function of the activation, got {type(fn).__name__}")
        point, hook_fn = _hook_on(name, fn, points)
        chains[point] = (*chains.get(point, ()), hook_fn)
    return chains


def backward_of_scalar(scalar: Any, cache: ActivationCache) -> None:
    """Run a backward pass from ``scalar`` to the activations ``cache`` kept, which records
    their gradients in ``cache.grads`` (and runs the backward hooks it reaches on the way).
    Nothing is accumulated in the parameters' ``.grad``, and the graph is freed.

    Raises:
        ValueError: not a tensor of one element that carries autograd history.
    """
    if not isinstance(scalar, Tensor) or scalar.numel() != 1:
        got = f"a tensor {list(scalar.shape)}" if isinstance(scalar, Tensor) else type(scalar).__name__
        raise ValueError(
            f"incl_bwd=True runs a backward pass from a scalar: the output itself or metric(output) must be a "
            f"tensor of one element, got {got}"
        )
    if not scalar.requires_grad:
        raise ValueError(
            "incl_bwd=True runs a backward pass from a scalar that depends on the kept activations, but this "
            "scalar carries no gradient (computed under torch.no_grad, or from no kept activation)"
        )
    kept = cache.tensors_with_history()
    if not kept:
        raise ValueError("incl_bwd=True keeps gradients of kept activations, but the cache kept none with a gradient")
    torch.autograd.grad(scalar, kept, allow_unused=True)


def named_hooks(hooks: Hooks | None, points: Mapping[str, HookPoint], what: str) -> list[tuple[str, HookFn]]:
    """``(name, function)`` pairs of hooks given by name, or as TransformerLens' list of
    ``(name or predicate, function)`` pairs, in order. A predicate hooks every point whose
    TransformerLens name it accepts (in TL's layout), then every other point whose attnkit
    name it accepts, each point once; one that accepts none hooks none, as in TL.

    Raises:
        TypeError: an entry of the list that is not a ``(name or predicate, function)`` pair.
    """
    if not hooks:
        return []
    if isinstance(hooks, Mapping):
        return list(hooks.items())
    pairs: list[tuple[str, HookFn]] = []
    for entry in hooks:
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise TypeError(f"each {what} is a (name or predicate, function) pair, got {entry!r}")
        name, fn = entry
        if isinstance(name, str):
            pairs.append((name, fn))
        elif callable(name):
            pairs.extend((accepted, fn) for accepted in _names_accepted(name, points))
        else:
            raise TypeError(f"a {what}'s name must be a string or a predicate on names, got {type(name).__name__}")
    return pairs


def _names_accepted(predicate: Callable[[str], bool], points: Mapping[str, HookPoint]) -> list[str]:
    """The names a predicate accepts, one per point: its TransformerLens name where the
    predicate accepts that, else its attnkit name."""
    accepted, taken = [], set()
    for tl_name, alias in transformerlens_aliases(points).items():
        if alias.point not in taken and predicate(tl_name):
            accepted.append(tl_name)
            taken.add(alias.point)
    accepted.extend(name for name in points if name not in taken and predicate(name))
    return accepted


def check_hook_names(names: Collection[str], points: Mapping[str, HookPoint], what: str) -> None:
    """Check that every name is one of ``points``.

    Raises:
        TypeError: names given as one string.
        ValueError: unknown names; the message lists the known ones.
    """
    if isinstance(names, str):
        raise TypeError(f"{what} names must be a collection of names, got the string {names!r}")
    aliases = None
    unknown = []
    for name in names:
        if name not in points:
            aliases = transformerlens_aliases(points) if aliases is None else aliases
            if name not in aliases:
                unknown.append(name)
    if unknown:
        raise ValueError(
            f"unknown {what} name{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"the names are {summarize_names(points)}"
        )


def summarize_names(names: Collection[str]) -> str:
    """The names with the layer indices folded: ``decoder.layers.{0..29}.{resid_pre, ...}``."""
    groups: dict[str, list[str]] = {}
    layers: dict[str, set[int]] = {}
    for name in names:
        match = LAYER_INDEX.search(name)
        if match is None:
            groups.setdefault(name, [])
            continue
        head = name[: match.start(1)]
        tail = name[match.end(1) + 1 :]
        if tail not in groups.setdefault(head, []):
            groups[head].append(tail)
        layers.setdefault(head, set()).add(int(match.group(1)))
    parts = []
    for head, tails in groups.items():
        if head not in layers:
            parts.append(head)
            continue
        indices = sorted(layers[head])
        span = f"{{{indices[0]}..{indices[-1]}}}" if len(indices) > 1 else str(indices[0])
        parts.append(f"{head}{span}.{{{', '.join(tails)}}}")
    return ", ".join(parts)


def cached_points(names_filter: NameFilter, points: Mapping[str, HookPoint]) -> dict[HookPoint, str]:
    """Point → name for the points a cache keeps.

    Raises:
        ValueError: an unknown name in ``names_filter`` (the message lists the names).
    """
    if names_filter is None:
        return {point: name for name, point in points.items()}
    if isinstance(names_filter, str):  # one name, as TransformerLens takes it
        names_filter = [names_filter]
    if callable(names_filter) and not isinstance(names_filter, (str, Collection)):
        accepted = {name for name in points if names_filter(name)}
        # A predicate written for TransformerLens' names keeps the points they name.
        accepted |= {alias.point for tl_name, alias in transformerlens_aliases(points).items() if names_filter(tl_name)}
        return {point: name for name, point in points.items() if name in accepted}
    check_hook_names(names_filter, points, "cached")
    aliases = transformerlens_aliases(points) if any(name not in points for name in names_filter) else {}
    kept = (name if name in points else aliases[name].point for name in names_filter)
    return {points[name]: name for name in kept}


def _hook_on(name: str, fn: HookFn, points: Mapping[str, HookPoint]) -> tuple[HookPoint, HookCall]:
    """The point ``name`` (attnkit's or TransformerLens') names, and ``fn`` as a function
    of ``(activation, hook)`` there: under a TransformerLens name it sees TL's layout and
    hook record (:mod:`attnkit.nn.transformerlens_names`)."""
    if name in points:
        return points[name], _with_hook_argument(fn)
    alias = transformerlens_aliases(points)[name]
    return points[alias.point], _in_transformerlens_layout(name, alias, _with_hook_argument(fn))


def _in_transformerlens_layout(tl_name: str, alias: TransformerLensName, fn: HookCall) -> HookCall:
    """``fn`` on the activation as TransformerLens lays it out, positions before heads for
    the per-head points (a view), its replacement laid back in attnkit's layout. A hook
    that changed the activation in place, as TL's hooks do, replaces it: the module then
    uses what the hook left (an unchanged activation keeps the fused path)."""

    def hook(activation: Tensor, point: HookPoint) -> Tensor | None:
        seen = activation.transpose(1, 2) if alias.heads_second else activation
        before = _version_of(activation)
        replaced = fn(seen, TransformerLensHook(tl_name, alias.point, point.layer))  # type: ignore[arg-type]
        if replaced is None or replaced is seen:
            changed = before is None or _version_of(activation) != before
            return activation.view_as(activation) if changed else None
        if alias.heads_second and isinstance(replaced, Tensor) and replaced.ndim == activation.ndim:
            return replaced.transpose(1, 2)
        return replaced

    return hook


def _version_of(tensor: Tensor) -> int | None:
    """How many times ``tensor``'s memory was changed in place, or ``None`` where torch does
    not count it (a tensor made under :func:`torch.inference_mode`)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def _with_hook_argument(fn: HookFn) -> Callable[[Tensor, HookPoint], Tensor | None]:
    """``fn`` as a function of ``(activation, hook)``: it gets both when it requires two
    positional arguments (or takes ``*args``), the activation alone otherwise (so that
    ``def f(z, head=head)`` keeps its default)."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature: pass both
        return fn
    required = [
        p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if any(p.kind == p.VAR_POSITIONAL for p in parameters) or len(required) >= 2:
        return fn
    return lambda activation, hook: fn(activation)
