"""Renaming a checkpoint's tensors to the state-dict keys of attnkit's network.

Each family says where each of its checkpoint's keys goes; what every family does alike is
here: keys that are expected but have no place in the network (saved buffers, a pooler,
copies of a tied matrix) are dropped, the keys nobody claims are returned as unknown (the
loader refuses them by name), and a tensor a checkpoint stores once is given to every key
that shares it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from torch import Tensor

# A family's renaming of one key: (checkpoint key, tensor) → the state-dict entries it
# becomes (several when a fused tensor is split or one table serves many layers; ``{}`` for
# a key dropped on purpose), or ``None`` for a key with no place in the network.
Rename = Callable[[str, Tensor], dict[str, Tensor] | None]


def rename_tensors(
    tensors: dict[str, Tensor],
    rename: Rename,
    *,
    dropped: re.Pattern[str] | None = None,
    shared: Mapping[str, str] | None = None,
) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a checkpoint's tensors to state-dict keys.

    Args:
        tensors: the checkpoint's tensors.
        rename: the family's renaming of each key (:data:`Rename`).
        dropped: keys that checkpoints hold beside the weights and the network recomputes
            or leaves out (causal masks, rotary frequencies, position ids, a pooler):
            neither loaded nor unknown.
        shared: state-dict key → the key whose tensor it takes once all are renamed (a
            head tied to the token embedding, a target embedding that is the source's),
            where that key was loaded.

    Returns:
        ``(state, unknown)``: the renamed tensors, and the checkpoint keys with no place.
    """
    state: dict[str, Tensor] = {}
    unknown = []
    for key, value in tensors.items():
        if dropped is not None and dropped.fullmatch(key):
            continue
        entries = rename(key, value)
        if entries is None:
            unknown.append(key)
        else:
            state.update(entries)
    for key, source in (shared or {}).items():
        if source in state:
            state[key] = state[source]
    return state, unknown
