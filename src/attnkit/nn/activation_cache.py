"""The activations one forward pass recorded, by hook name (:mod:`attnkit.nn.hooks`), and
what a residual-stream analysis computes from them: the stream after each layer, its
decomposition into the blocks that wrote it, each head's share, the final norm applied to
any of these (the logit lens) and their direct contribution to a logit.

The largest entries, each attention layer's ``scores`` and ``pattern`` ``[b, h, s, s_k]``
and its per-head ``result`` ``[b, h, s, e]``, are computed when first read, from tensors
the forward pass recorded (the layer's queries and keys, or its heads' outputs): a
:class:`DeferredActivations`. A forward pass that keeps them then costs about what one
without them costs, and a cache of SmolLM2 at 1,024 tokens holds 2.9 GB less until its
patterns are read. What a read returns is what the forward pass would have recorded, bit
for bit: the same function computes it from the same tensors, whatever is done after the
pass to the model, its options or the cached tensors (a read that cannot promise it
raises). A pass over no more positions than the head dim forms its per-head results: they
are then no larger than the copy of the output projection a later read would need.

Shape letters: ``k`` stacked components, ``b`` batch, ``s`` positions, ``e`` model dim,
``h`` heads, ``v`` vocabulary.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor, nn
from torch.utils.weak import WeakIdKeyDictionary

from attnkit.deprecation import deprecated_aliases
from attnkit.nn.transformerlens_names import transformerlens_aliases

# The layer index in a hook point's name: "decoder.layers.3.self_attn.pattern" → 3.
LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class _Hooked(Protocol):
    """What the cache needs of its model (an :class:`attnkit.nn.HookedModule`)."""

    def hook_name(self, name: str, layer: int | None = None) -> str: ...

    def hook_names(self) -> list[str]: ...

    def get_submodule(self, target: str) -> nn.Module: ...


@dataclass(eq=False)
class DeferredActivations:
    """Activations of one module that a cache computes when one of them is first read,
    from tensors recorded during the forward pass.

    What a read returns is what the pass would have recorded, or the read raises: nothing
    done after the pass may change it silently. Writes through ``.data`` or a NumPy view
    do not move torch's version counters, so a version check alone cannot see them; the
    tensors are therefore of two kinds. Those others hold (weights, a mask or bias the
    caller passed) are copied when the pass records them (:func:`snapshot`), and options
    are bound as values in ``compute``. Those the pass made (queries, keys, head outputs)
    are read where they are while only the pass's hooks and caches have them: the point
    that recorded one copies it at once if a hook saw it, and a cache copies it before it
    first hands out a tensor sharing its memory (:func:`attnkit.nn.hooks.record_on_read`,
    :meth:`keep_copy`). Their version counters are checked at the read as well, so that a
    change by any other path raises.

    Args:
        compute: returns the activations (called as ``compute(**inputs, **copies)``), in
            the order of the points that recorded them; called without autograd.
        inputs: name → tensor the pass made that ``compute`` takes (``"queries"``,
            ``"head_outputs"``), read in place until handed out; named in the error a read
            raises.
        what: what is computed, for that error (``"decoder.layers.3.self_attn scores and
            pattern"``).
        copies: name → a copy already made of a tensor that ``compute`` takes
            (:func:`snapshot`: the output projection's weight, the caller's mask).
    """

    compute: Callable[..., Sequence[Tensor]]
    inputs: dict[str, Tensor]
    what: str
    copies: dict[str, Tensor] = field(default_factory=dict)
    versions: dict[str, int] = field(init=False)
    # The caches that keep these activations and have not computed them yet.
    pending: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.inputs = dict(self.inputs)
        self.versions = {name: tensor._version for name, tensor in self.inputs.items()}

    def keep_copy(self, name: str, recorded: Tensor) -> None:
        """Compute from a copy of the input ``name`` from now on, before a tensor sharing
        its memory is handed out (``recorded``: that input as the pass recorded it). A no-op
        once it is a copy already, after a change in place (the read raises) and once every
        cache has computed the activations."""
        tensor = self.inputs.get(name)
        if tensor is recorded and tensor._version == self.versions[name]:
            tensor = private_copy(tensor)
            self.inputs[name], self.versions[name] = tensor, tensor._version

    def keep_copies(self) -> None:
        """:meth:`keep_copy` of every input: a hook was handed one of them, or a tensor
        sharing memory with one."""
        for name, tensor in list(self.inputs.items()):
            self.keep_copy(name, tensor)

    def shares_memory_with(self, tensor: Tensor) -> list[tuple[str, Tensor]]:
        """The inputs, ``(name, tensor)``, held in the same memory as ``tensor``."""
        storage = tensor.untyped_storage().data_ptr()
        return [(name, t) for name, t in self.inputs.items() if t.untyped_storage().data_ptr() == storage]

    def run(self) -> Sequence[Tensor]:
        """The activations.

        Raises:
            RuntimeError: an input changed in place since the forward pass.
        """
        changed = [name for name, tensor in self.inputs.items() if tensor._version != self.versions[name]]
        if changed:
            recorded = ", ".join(name.replace("_", " ") for name in self.inputs)
            raise RuntimeError(
                f"the {self.what} of this cache are computed when first read, from the {recorded} that the "
                f"forward pass recorded, and the {' and '.join(name.replace('_', ' ') for name in changed)} "
                "changed in place since (directly or through a tensor sharing their memory, such as another "
                "cached activation of the same projection); read these entries before changing cached tensors, "
                "or run the forward pass again"
            )
        with torch.no_grad():
            return self.compute(**self.inputs, **self.copies)

    def computed_by_one_cache(self) -> None:
        """One of the caches that keep these activations has computed them: once all have,
        the inputs are let go."""
        self.pending -= 1
        if self.pending <= 0:
            self.inputs, self.copies = {}, {}


def snapshot(tensor: Tensor) -> Tensor:
    """A copy of ``tensor`` that nothing else writes to, laid out as it is (same strides
    and alignment, so that kernels compute the same bits from it; a parameter's copy is a
    parameter that wants no gradient): the copy made last time when it is still held and
    holds ``tensor``'s exact bits, else a new one. Keep the returned object itself (not a
    view of it) for the next call to find it.

    On the CPU, comparing costs about what copying costs (both read the tensor), and
    reusing the copy keeps one copy of a layer's weight for every cache of the same
    weights, and one of a mask every layer receives. On other devices the comparison would
    wait for the device at every layer: a new copy is made each time.
    """
    if tensor.device.type != "cpu":
        return _copy_of(tensor)
    with _snapshots_lock:
        kept = _snapshots.get(tensor)
    copy = kept() if kept is not None else None
    if copy is not None and _same_bits(copy, tensor):
        return copy
    copy = _copy_of(tensor)
    with _snapshots_lock:
        _snapshots[tensor] = weakref.ref(copy)
    return copy


def _copy_of(tensor: Tensor) -> Tensor:
    """:func:`private_copy`, a parameter's as a parameter that wants no gradient."""
    copy = private_copy(tensor)
    return nn.Parameter(copy, requires_grad=False) if isinstance(tensor, nn.Parameter) else copy


def private_copy(tensor: Tensor) -> Tensor:
    """A new copy of ``tensor`` with its strides and its address modulo
    :data:`_ALIGNMENT` (matrix kernels may choose their code, and so their rounding, by
    both). A broadcast dimension (stride 0) stays broadcast; a tensor whose elements share
    memory in another way is copied contiguous."""
    tensor = tensor.detach()
    broadcast = tuple(stride == 0 and size > 1 for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    source = tensor[tuple(slice(0, 1) if b else slice(None) for b in broadcast)] if any(broadcast) else tensor
    extent = 1 + sum((size - 1) * stride for size, stride in zip(source.shape, source.stride(), strict=True))
    itemsize = source.element_size()
    memory = torch.empty(extent + _ALIGNMENT // itemsize, dtype=source.dtype, device=source.device)
    offset = (source.data_ptr() - memory.data_ptr()) % _ALIGNMENT // itemsize
    copy = memory.as_strided(source.shape, source.stride(), offset)
    try:
        copy.copy_(source)
    except RuntimeError:  # elements that share memory (an unfolded view): no layout to keep
        return tensor.clone(memory_format=torch.contiguous_format)
    return copy.expand(tensor.shape) if any(broadcast) else copy


def _same_bits(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` hold the same bits in the same layout (``0.0`` and ``-0.0``
    differ; a NaN equals itself)."""
    if (a.dtype, a.shape, a.stride(), a.device) != (b.dtype, b.shape, b.stride(), b.device):
        return False
    if a.data_ptr() % _ALIGNMENT != b.data_ptr() % _ALIGNMENT:
        return False
    a, b = a.detach(), b.detach()
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.is_floating_point():
        as_int = _INT_OF_SIZE[a.element_size()]
        a, b = a.view(as_int), b.view(as_int)
    return torch.equal(a, b)


# TransformerLens' names of gradients: the hook name and this suffix.
_GRAD_SUFFIX = "_grad"
# Matrix kernels pick code by the alignment of their operands; a copy keeps the original's.
_ALIGNMENT = 512
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# Each tensor given to snapshot() → its latest copy, alive while some cache holds it.
_snapshots: WeakIdKeyDictionary = WeakIdKeyDictionary()
_snapshots_lock = threading.Lock()


def computable_later(*tensors: Tensor) -> bool:
    """Whether a cache may compute activations from ``tensors`` when first read rather than
    now: none carries autograd history that gradients would need (under
    :func:`torch.no_grad`, or none requires them), and none is an inference tensor (made
    under :func:`torch.inference_mode`), which keeps no version counter to tell whether it
    changed since."""
    if any(tensor.is_inference() for tensor in tensors):
        return False
    return not (torch.is_grad_enabled() and any(tensor.requires_grad for tensor in tensors))


@dataclass(frozen=True)
class _OnRead:
    """A cache entry not computed yet: the ``index``-th activation of ``deferred``."""

    deferred: DeferredActivations
    index: int


@deprecated_aliases(record_on_read="add_computed_on_read", removed_in="0.3")
class ActivationCache(MutableMapping[str, Tensor]):
    """Hook name → the activation recorded there (after any hook that replaced it), as
    :meth:`attnkit.nn.HookedModule.run_with_cache` returns it.

    Besides full names, ``cache["pattern", 3]`` looks a point up by the end of its name
    and its layer (:meth:`attnkit.nn.HookedModule.hook_name`), ``cache["final_norm.scale"]``
    a point outside the layers by the end of its name, and TransformerLens' names
    (``cache["blocks.3.attn.hook_z"]``) are accepted, the per-head entries then in TL's
    layout ``[b, s, h, d]`` (a view; :mod:`attnkit.nn.transformerlens_names`). Entries recorded by
    :meth:`add_computed_on_read` are computed when first read (by ``cache[name]``, ``.get``,
    ``.items()``, ``.values()``) and kept; :meth:`unread` names those not computed yet.
    The residual-stream helpers read a pre-norm model with one stack
    (:class:`attnkit.nn.DecoderLM`, the LLaMA checkpoints), where the stream is the sum of
    the embeddings and of every block's output; they need the names they combine in the
    cache (``run_with_cache()`` keeps them all).

    A cache that recorded gradients (``run_with_cache(..., incl_bwd=True)``) holds them in
    :attr:`grads`, by the same names; ``cache[name + "_grad"]`` reads one too, as
    TransformerLens names them.

    Args:
        model: the module whose names these are.
    """

    # The gradients (:attr:`grads`), made when first asked for; ``None`` in a cache pickled
    # before caches kept gradients.
    _grads: ActivationCache | None = None

    def __init__(self, model: _Hooked) -> None:
        self.model = model
        self._entries: dict[str, Tensor | _OnRead] = {}
        self._grads: ActivationCache | None = None
        # Entry name → the computations that read a tensor in its memory in place (each
        # with the input's name and tensor): each keeps a copy before the entry is first
        # handed out.
        self._shared: dict[str, list[tuple[DeferredActivations, str, Tensor]]] = {}

    @property
    def grads(self) -> ActivationCache:
        """The gradients a backward pass gave the recorded activations, by the same names
        (hook name → gradient of the scalar the backward pass ran from with respect to that
        activation, shaped like it), with this cache's lookups and residual-stream helpers:
        ``cache.grads["pattern", 3]``, ``cache.grads.stack_head_results()``. Empty unless
        the cache was asked to record gradients (``incl_bwd=True``)."""
        if self._grads is None:
            self._grads = ActivationCache(self.model)
        return self._grads

    def __getitem__(self, key: str | tuple[str, int | None]) -> Tensor:
        if isinstance(key, str) and key not in self._entries and key.endswith(_GRAD_SUFFIX) and self._grads:
            return self._grads[key.removesuffix(_GRAD_SUFFIX)]
        if isinstance(key, tuple):
            name, layer = key
            key = self.model.hook_name(name, layer)
        if key not in self._entries:
            return self._by_other_name(key)
        return self._entry(key)

    def _by_other_name(self, key: str) -> Tensor:
        """The entry a TransformerLens name (in TL's layout: a view) or the end of a name
        outside the layers (``"final_norm.scale"``) stands for."""
        alias = transformerlens_aliases(self.model.hook_names()).get(key)
        if alias is not None:
            entry = self._entry(alias.point)
            return entry.transpose(1, 2) if alias.heads_second else entry  # [b, s, h, d] for TL's per-head names
        try:
            full = self.model.hook_name(key)
        except ValueError as err:
            raise KeyError(str(err)) from None
        return self._entry(full)

    def _entry(self, key: str) -> Tensor:
        entry = self._entries[key]
        if isinstance(entry, _OnRead):
            return self._compute(entry)
        for deferred, input_name, recorded in self._shared.pop(key, ()):
            deferred.keep_copy(input_name, recorded)
        return entry

    def __setitem__(self, key: str, value: Tensor) -> None:
        self._entries[key] = value
        self._shared.pop(key, None)  # the tensor it held is no longer handed out here

    def __delitem__(self, key: str) -> None:
        del self._entries[key]
        self._shared.pop(key, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, tuple):
            try:
                key = self.model.hook_name(*key)
            except ValueError:
                return False
        if isinstance(key, str) and key not in self._entries and key.endswith(_GRAD_SUFFIX) and self._grads:
            return key.removesuffix(_GRAD_SUFFIX) in self._grads
        if key in self._entries or not isinstance(key, str):
            return key in self._entries
        alias = transformerlens_aliases(self.model.hook_names()).get(key)
        if alias is not None:
            return alias.point in self._entries
        try:
            return self.model.hook_name(key) in self._entries
        except ValueError:
            return False

    def __repr__(self) -> str:
        return f"ActivationCache({list(self._entries)})"

    def __getstate__(self) -> dict[str, object]:
        """What pickling (``torch.save``, a copy) keeps: every entry computed (those
        computed on read first, so that the tensors they come from need no copy)."""
        for name in self.unread():
            self[name]
        entries = {name: self[name] for name in self._entries}
        return {"model": self.model, "_entries": entries, "_shared": {}, "_grads": self._grads}

    def tensors_with_history(self) -> list[Tensor]:
        """The computed entries that carry autograd history (each tensor once): what a
        backward pass from a scalar computed from them reaches."""
        found: dict[int, Tensor] = {}
        for entry in self._entries.values():
            if isinstance(entry, Tensor) and entry.requires_grad:
                found.setdefault(id(entry), entry)
        return list(found.values())

    def detach_entries(self) -> None:
        """Keep every computed entry (and gradient) without its autograd history, as a
        cache filled by a pass that recorded gradients hands them out once the backward
        pass has run."""
        for name, entry in self._entries.items():
            if isinstance(entry, Tensor) and entry.requires_grad:
                self._entries[name] = entry.detach()
        if self._grads is not None:
            self._grads.detach_entries()

    def add_computed_on_read(self, names: Mapping[str, int], deferred: DeferredActivations) -> None:
        """Keep entries that ``deferred`` computes when one of them is first read.

        Args:
            names: name → the index of its activation among those ``deferred`` computes.
            deferred: the computation, shared by these names.
        """
        for name, index in names.items():
            self._entries[name] = _OnRead(deferred, index)
        deferred.pending += 1

    def share_memory(self, name: str, deferred: DeferredActivations) -> None:
        """Let ``deferred`` read its inputs that share memory with the entry ``name`` in
        place until this cache first hands that entry out: ``deferred`` then keeps copies
        of them (:meth:`DeferredActivations.keep_copy`)."""
        entry = self._entries.get(name)
        if isinstance(entry, Tensor):
            for input_name, recorded in deferred.shares_memory_with(entry):
                self._shared.setdefault(name, []).append((deferred, input_name, recorded))

    def unread(self) -> list[str]:
        """The names added by :meth:`add_computed_on_read` and not computed yet."""
        return [name for name, entry in self._entries.items() if isinstance(entry, _OnRead)]

    def _compute(self, entry: _OnRead) -> Tensor:
        """Run ``entry``'s computation once and keep every entry of this cache it gives."""
        values = entry.deferred.run()
        for name, other in self._entries.items():
            if isinstance(other, _OnRead) and other.deferred is entry.deferred:
                self._entries[name] = values[other.index]
        entry.deferred.computed_by_one_cache()
        return values[entry.index]

    @property
    def num_layers(self) -> int:
        """The number of layers of the model's stack."""
        indices = [int(m.group(1)) for name in self.model.hook_names() if (m := LAYER_INDEX.search(name))]
        return 1 + max(indices, default=-1)

    def accumulated_resid(self, layer: int | None = None, *, incl_mid: bool = False) -> tuple[Tensor, list[str]]:
        """The residual stream as it enters each layer, then as it leaves the last.

        Args:
            layer: stop before this layer (its ``resid_pre`` is the last entry); ``None``
                for every layer and the stream out of the last.
            incl_mid: also the stream between each layer's attention and MLP.

        Returns:
            ``(stack [k, b, s, e], labels)``, labels such as ``"0_pre"``, ``"0_mid"``,
            ``"final_post"``.

        Raises:
            KeyError: a name the cache did not keep.
        """
        end = self.num_layers if layer is None else layer
        parts, labels = [], []
        for i in range(end):
            parts.append(self["resid_pre", i])
            labels.append(f"{i}_pre")
            if incl_mid:
                parts.append(self["resid_mid", i])
                labels.append(f"{i}_mid")
        if layer is None:
            parts.append(self["resid_post", self.num_layers - 1])
            labels.append("final_post")
        elif layer < self.num_layers:
            parts.append(self["resid_pre", layer])
            labels.append(f"{layer}_pre")
        return torch.stack(parts), labels

    def decompose_resid(self, layer: int | None = None) -> tuple[Tensor, list[str]]:
        """The residual stream split into what wrote it: the embeddings, then each layer's
        attention and MLP output. The parts sum to the stream entering ``layer`` (the
        stream out of the last layer for ``None``).

        Returns:
            ``(stack [k, b, s, e], labels)``: ``"embed"``, ``"0_attn_out"``,
            ``"0_mlp_out"``, ...

        Raises:
            KeyError: a name the cache did not keep.
        """
        end = self.num_layers if layer is None else layer
        parts, labels = [self["embed"]], ["embed"]
        for i in range(end):
            parts += [self["attn_out", i], self["mlp_out", i]]
            labels += [f"{i}_attn_out", f"{i}_mlp_out"]
        return torch.stack(parts), labels

    def stack_head_results(self, layer: int | None = None) -> tuple[Tensor, list[str]]:
        """Every head's output after its slice of the output projection (the ``result``
        points), as the residual stream receives it.

        Args:
            layer: the heads of the layers before this one; ``None`` for all.

        Returns:
            ``(stack [layers · h, b, s, e], labels)``: ``"L0H0"``, ``"L0H1"``, ...

        Raises:
            KeyError: a layer whose ``result`` the cache did not keep.
        """
        end = self.num_layers if layer is None else layer
        parts, labels = [], []
        for i in range(end):
            result = self["self_attn.result", i]  # [b, h, s, e]
            parts.append(result.transpose(0, 1))  # [h, b, s, e]
            labels += [f"L{i}H{head}" for head in range(result.shape[1])]
        return torch.cat(parts), labels

    def apply_ln_to_stack(self, stack: Tensor, *, recompute: bool = False) -> Tensor:
        """The final norm applied to each element of a stack ``[k, ..., e]``.

        Args:
            stack: residual streams or parts of one.
            recompute: normalise each element by its own scale: the logit lens of
                accumulated streams. Otherwise each is divided by the scale the final norm
                computed on the actual stream (cached ``final_norm.scale``), which is linear:
                parts normalised this way sum to the normalised stream (less a LayerNorm's
                bias, which no part owns).

        Returns:
            ``[k, ..., e]``.

        Raises:
            KeyError: the cache has no ``final_norm.scale`` (with ``recompute=False``).
        """
        scale_name = self.model.hook_name("final_norm.scale")
        norm = self.model.get_submodule(scale_name.rsplit(".", 1)[0])
        if recompute:
            return norm(stack)
        scale = self[scale_name]  # [b, s, 1]
        if isinstance(norm, nn.LayerNorm):
            stack = stack - stack.mean(-1, keepdim=True)
        normed = stack / scale
        weight = getattr(norm, "weight", None)
        if weight is None:
            return normed
        weight = weight.detach()
        return normed * (1.0 + weight) if getattr(norm, "plus_one", False) else normed * weight

    def logit_attrs(self, stack: Tensor, token: int, wrong: int | None = None) -> Tensor:
        """Direct logit attribution: each element's dot product with the unembedding of
        ``token`` (minus that of ``wrong``), what it adds to that logit (or to the logit
        difference) when it reaches the head directly. Give normalised elements
        (:meth:`apply_ln_to_stack`).

        Args:
            stack: ``[k, ..., e]``.
            token: a token id.
            wrong: another token id, for a logit difference.

        Returns:
            ``[k, ...]``.

        Raises:
            ValueError: a model without a language-model head.
        """
        try:
            head = self.model.get_submodule("lm_head")
        except AttributeError:
            raise ValueError("logit attribution needs a model with a language-model head (lm_head)") from None
        unembedding = head.weight
        assert isinstance(unembedding, Tensor)
        unembedding = unembedding.detach()  # [v, e]
        direction = unembedding[token]  # [e]
        if wrong is not None:
            direction = direction - unembedding[wrong]
        return stack @ direction.to(stack.dtype)
