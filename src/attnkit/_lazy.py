"""Names a package imports on first use (PEP 562), so that importing the package does not
wait for PyTorch. Imports nothing of attnkit, so that every package may use it."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, sources: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of a package whose public names are
    imported on first use.

    The first use of a name imports its module and binds every name of ``sources`` that
    comes from that module in ``namespace`` at once (importing ``attnkit.inspect.capture``
    binds the package's attribute ``capture`` to the module, which the function of that
    name must replace). A name whose module is ``package.name`` and has no attribute
    ``name`` is that module itself (``"masks": "attnkit.masks"``).

    Args:
        package: The package's ``__name__``, named in the error for an unknown name.
        sources: Public name → the module it comes from.
        namespace: The package's ``globals()``.

    Returns:
        ``(__getattr__, __dir__)`` for the package to assign.
    """

    def __getattr__(name: str) -> Any:
        if name not in sources:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(sources[name])
        for public, source in sources.items():
            if source != module.__name__:
                continue
            whole_module = source == f"{package}.{public}" and not hasattr(module, public)
            namespace[public] = module if whole_module else getattr(module, public)
        return namespace[name]

    def __dir__() -> list[str]:
        return sorted({*namespace, *sources})

    return __getattr__, __dir__
