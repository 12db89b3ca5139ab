"""Names in src/attnkit: no module reaches into another module's private names, and the words
that docs/glossary.md retired stay out of the code.

A private name (``_name``) belongs to the module that defines it. Another module may neither
import it (``from attnkit.x import _name``) nor read it off a module it imported
(``x_mod._name``). A private *module* (``attnkit.functional._validate``) is private to its
package: only modules of that package import it. A private attribute or method is read only
off ``self`` or ``cls``.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from tests.test_layering import module_files

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = SRC.parent

# Words and names the glossary retired, as regular expressions over the source text.
RETIRED = {
    r"\bBlockEngine\b": "the block call's two implementations are block ops (BlockOp)",
    r"\bblock_engine\b": "the block call's two implementations are block ops (block_op=)",
    r"\bDEPRECATED_NAMES\b": "no release had another kernel name: nothing to deprecate",
    r"\bkernel_spec\(": "KERNEL_SPECS[name] is the one way to a kernel's description",
    r"\b_MAX_KEYS_COALESCED\b": "the tiled kernel has no switched-off merging branch",
    r"\bfunctional\._blockwise\b": "the block call's module is public: attnkit.functional.blockwise",
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _inside(package: str, parent: str) -> bool:
    return package == parent or package.startswith(parent + ".")


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _private_uses(module: str, path: Path, known: set[str]) -> list[str]:
    """``module``'s uses of other modules' private names, as readable lines."""
    package = _package_of(module, path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[str] = []
    module_aliases: dict[str, str] = {}  # local name → attnkit module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnkit"):
            base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:  # ``from attnkit.functional import masks as masks_mod``
                    module_aliases[alias.asname or alias.name] = full
                    if _is_private(alias.name) and not _inside(package, base):
                        found.append(f"line {node.lineno}: imports the private module {full}")
                elif _is_private(alias.name):
                    found.append(f"line {node.lineno}: imports {base}.{alias.name}")
            if _is_private(base.rpartition(".")[2]) and not _inside(package, base.rpartition(".")[0]):
                found.append(f"line {node.lineno}: imports from the private module {base}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("attnkit") and alias.asname:
                    module_aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in module_aliases
            and _is_private(node.attr)
        ):
            found.append(f"line {node.lineno}: reads {module_aliases[node.value.id]}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names():
    files = module_files()
    known = set(files)
    found = {name: uses for name, path in files.items() if (uses := _private_uses(name, path, known))}
    assert found == {}


# Private attributes read off something other than self or cls: each is another library's
# (argparse's parser types, a torch op's schema, transformers' attention switch) or the
# same class's own method called on a new instance of it.
OTHERS_PRIVATE_ATTRIBUTES = {
    "argparse._SubParsersAction",
    "argparse._ArgumentGroup",
    "packet.default._schema",
    "config._attn_implementation",
    "hf_model._can_set_attn_implementation",
    "model._assemble",  # DecoderLM.from_parts, on the DecoderLM it creates
    # torch's version counter of a tensor: a mask tensor changed in place after its additive
    # bias was kept gets a new bias (attnkit.functional.pattern).
    "mask._version",
    # The same counter of the tensors a cache entry computed on first read comes from: changed
    # in place since the forward pass, they no longer give what it recorded
    # (attnkit.nn.activation_cache).
    "tensor._version",
}


def test_no_module_reads_a_private_attribute_of_another_object():
    found = []
    for name, path in module_files().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            if ast.unparse(node) not in OTHERS_PRIVATE_ATTRIBUTES:
                found.append(f"{name} line {node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_benchmarks_and_doc_scripts_use_no_private_names_of_attnkit():
    known = set(module_files())
    scripts = [*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "docs").glob("*.py")]
    found = {
        str(path.relative_to(ROOT)): uses
        for path in sorted(scripts)
        if (uses := _private_uses(f"scripts.{path.stem}", path, known))
    }
    assert found == {}


def test_the_checker_sees_each_kind_of_private_use(tmp_path):
    source = tmp_path / "user.py"
    source.write_text(
        "from attnkit.functional import masks as masks_mod\n"
        "from attnkit.functional.tiled import _forward\n"
        "from attnkit.functional._validate import check_inputs\n"
        "masks_mod._as_bool(True)\n"
    )
    known = {"attnkit.functional.masks", "attnkit.functional._validate", "attnkit.functional.tiled"}
    uses = _private_uses("attnkit.distributed.user", source, known)
    assert uses == [
        "line 2: imports attnkit.functional.tiled._forward",
        "line 3: imports from the private module attnkit.functional._validate",
        "line 4: reads attnkit.functional.masks._as_bool",
    ]
    assert _private_uses("attnkit.functional.user", source, known)[1:2] == [
        "line 4: reads attnkit.functional.masks._as_bool"
    ]


@pytest.mark.parametrize("pattern", sorted(RETIRED))
def test_retired_words_stay_out_of_the_code(pattern):
    regex = re.compile(pattern)
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((SRC / "attnkit").rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if regex.search(line)
    ]
    assert found == [], RETIRED[pattern]


def test_kernel_is_never_the_name_of_a_caller():
    """``kernel=`` passes a name of the kernel table; the public function named in an error
    message is ``caller=``."""
    from attnkit.functional.kernels import KERNEL_SPECS

    names = {*KERNEL_SPECS, "ring"}
    found = []
    for path in sorted((SRC / "attnkit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg == "kernel" and isinstance(node.value, ast.Constant):
                if node.value.value not in names:
                    found.append(f"{path.relative_to(ROOT)}:{node.value.lineno}: kernel={node.value.value!r}")
    assert found == []


def test_the_shims_for_names_no_release_had_are_gone():
    import attnkit
    from attnkit.functional import KERNELS

    assert "pattern" not in inspect.signature(attnkit.sparse_attention).parameters
    assert "dense" not in KERNELS


def test_the_glossary_is_in_the_documentation_site():
    assert (ROOT / "docs" / "glossary.md").is_file()
    assert "glossary.md" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
