"""Old spellings of renamed keywords, attributes and module paths, kept working for one
release.

Each use warns with a :class:`DeprecationWarning` naming the new spelling and the release
that removes the old one. Nothing else in attnkit imports an old spelling.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
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


class MovedModules(importlib.abc.MetaPathFinder):
    """An import hook that keeps old module paths working, with a warning.

    Importing an old path warns with a :class:`DeprecationWarning` that names the new path
    and the release that removes the old one, then gives the module at the new path itself
    (the same object, so a name patched on one is patched on both). An old module whose
    names went to several new ones gives a module that reads each name from the first new
    module that has it. The hook answers only for the paths of its table, after every other
    finder, so it never shadows a module that exists.

    Args:
        moved: old module path → its new path, or the new paths its names went to.
        removed_in: the release that removes the old paths.
    """

    def __init__(self, moved: Mapping[str, str | tuple[str, ...]], *, removed_in: str) -> None:
        self.moved = {old: (new,) if isinstance(new, str) else new for old, new in moved.items()}
        self.removed_in = removed_in

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec that loads an old path's module, or ``None`` for any other path."""
        if fullname not in self.moved:
            return None
        return importlib.util.spec_from_loader(fullname, _MovedModuleLoader(self.moved[fullname], self.removed_in))

    def install(self) -> None:
        """Put the hook last on :data:`sys.meta_path`, replacing one that answers for the
        same paths (a package imported again installs its table again)."""
        sys.meta_path[:] = [
            finder
            for finder in sys.meta_path
            if not (isinstance(finder, MovedModules) and finder.moved.keys() == self.moved.keys())
        ]
        sys.meta_path.append(self)


class _MovedModuleLoader(importlib.abc.Loader):
    """Loads an old module path as the module (or modules) it moved to."""

    def __init__(self, new: tuple[str, ...], removed_in: str) -> None:
        self.new = new
        self.removed_in = removed_in
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        warnings.warn(
            f"{spec.name} is now {_listed(self.new)}; the old path goes in attnkit {self.removed_in}",
            DeprecationWarning,
            stacklevel=2,  # the import statement: warnings skips the import system's frames
        )
        modules = [importlib.import_module(name) for name in self.new]
        if len(modules) == 1:
            self.spec = modules[0].__spec__
            return modules[0]
        return _merged_module(spec.name, modules)

    def exec_module(self, module: types.ModuleType) -> None:
        if self.spec is not None:  # the import system set the old path's spec on the module
            module.__spec__ = self.spec


def _merged_module(name: str, modules: list[types.ModuleType]) -> types.ModuleType:
    """A module whose names are read from the first of ``modules`` that has them."""
    merged = types.ModuleType(name, f"Moved to {', '.join(m.__name__ for m in modules)}.")

    def __getattr__(attribute: str) -> Any:
        for module in modules:
            if hasattr(module, attribute):
                return getattr(module, attribute)
        raise AttributeError(
            f"module {name!r} has no attribute {attribute!r} (its names moved to "
            f"{', '.join(m.__name__ for m in modules)})"
        )

    def __dir__() -> list[str]:
        return sorted({n for m in modules for n in dir(m) if not n.startswith("_")})

    merged.__getattr__ = __getattr__  # type: ignore[method-assign]
    merged.__dir__ = __dir__  # type: ignore[method-assign]
    return merged


def _listed(names: tuple[str, ...]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def moved_names(module: str, moved: Mapping[str, str], *, removed_in: str) -> Callable[[str], Any]:
    """A module's ``__getattr__`` that still gives the names it lost to other modules, with a
    warning (``__getattr__ = moved_names(__name__, {...}, removed_in=...)``).

    Args:
        module: the old module's name.
        moved: each moved name → the module it now lives in.
        removed_in: the release that removes the old paths.

    Returns:
        The function to assign to the old module's ``__getattr__``.
    """

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} is now {moved[name]}.{name}; the old path goes in attnkit {removed_in}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(moved[name]), name)

    return __getattr__
