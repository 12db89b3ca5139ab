"""The packages' names imported on first use (attnkit._lazy): each package's ``__getattr__``
and ``__dir__``, and the helper's import cost."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest

from attnkit._lazy import lazy_names

PACKAGES = ["attnkit", "attnkit.inspect", "attnkit.models", "attnkit.models.model", "attnkit.train"]


@pytest.mark.parametrize("package", PACKAGES)
def test_an_unknown_name_is_an_attribute_error_naming_the_package_and_the_name(package):
    module = importlib.import_module(package)
    with pytest.raises(AttributeError, match=rf"^module '{package}' has no attribute 'no_such_name'$"):
        module.no_such_name  # noqa: B018


@pytest.mark.parametrize("package", PACKAGES)
def test_dir_lists_every_public_name_before_its_first_use(package):
    module = importlib.import_module(package)
    assert set(module.__all__) <= set(dir(module))


def test_a_name_is_the_module_s_attribute_even_where_the_module_shares_its_name():
    import attnkit.inspect
    from attnkit.inspect import capture as capture_module_or_function

    assert isinstance(capture_module_or_function, types.FunctionType)
    assert attnkit.inspect.capture is sys.modules["attnkit.inspect.capture"].capture


def test_a_name_whose_module_is_the_package_s_submodule_of_that_name_is_the_module():
    import attnkit

    assert attnkit.masks is sys.modules["attnkit.masks"]


def test_the_first_use_binds_every_name_of_that_module():
    namespace: dict[str, object] = {}
    getattr_, dir_ = lazy_names("pkg", {"dumps": "json", "loads": "json", "sqrt": "math"}, namespace)
    assert dir_() == ["dumps", "loads", "sqrt"]
    getattr_("dumps")
    assert set(namespace) == {"dumps", "loads"}


def test_the_helper_imports_neither_torch_nor_any_other_part_of_attnkit():
    code = (
        "import sys\n"
        "import attnkit._lazy\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('attnkit.')))\n"
    )
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert printed.strip() == "['attnkit._lazy']"
