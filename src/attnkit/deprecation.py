"""Old spellings of renamed keywords and attributes, kept working for one release.

Each use warns with a :class:`DeprecationWarning` naming the new spelling and the release
that removes the old one. Nothing else in attnkit imports an old spelling.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)


def renamed_keywords(*, removed_in: str, **old_to_new: str) -> Callable[[F], F]:
    """Accept each old keyword of a function as its new one, with a warning.

    Args:
        removed_in: the release that stops accepting the old keywords.
        old_to_new: old keyword → new keyword.

    Returns:
        A decorator for the function.

    Raises:
        TypeError (from the decorated function): both spellings of one keyword given.
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(
                            f"{fn.__qualname__}() got both {old}= and {new}=; {old}= is the old spelling of {new}="
                        )
                    warnings.warn(
                        f"{fn.__qualname__}({old}=...) is now {new}=...; {old}= goes in attnkit {removed_in}",
                        DeprecationWarning,
                        stacklevel=2,
                    )
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def deprecated_aliases(*, removed_in: str, **old_to_new: str) -> Callable[[C], C]:
    """Give a class read-only properties under old attribute names, with a warning.

    Args:
        removed_in: the release that removes the old names.
        old_to_new: old attribute → the attribute it now is.

    Returns:
        A class decorator (put it above ``@dataclass``).
    """

    def alias(cls_name: str, old: str, new: str) -> property:
        def get(self: Any) -> Any:
            warnings.warn(
                f"{cls_name}.{old} is now {cls_name}.{new}; .{old} goes in attnkit {removed_in}",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(self, new)

        return property(get, doc=f"Deprecated: :attr:`{new}`.")

    def decorate(cls: C) -> C:
        for old, new in old_to_new.items():
            setattr(cls, old, alias(cls.__name__, old, new))
        return cls

    return decorate
