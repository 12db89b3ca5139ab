"""A family is one file plus one entry in the table (attnkit.models.families.table.FAMILIES):
nothing else imports a family's file or names its model_type. Walks the imports of every
module under src/attnkit."""

from __future__ import annotations

import ast

from attnkit.models.families.table import FAMILIES
from tests.test_layering import imports_of, module_files

TABLE = "attnkit.models.families.table"
# attnkit train writes the folders that the family of its trained models reads.
WRITERS = {"attnkit.train.export": "attnkit.models.families.trained"}


def _family_modules() -> dict[str, str]:
    """Module name → the model_types its ``ModelFamily`` objects load, for every module
    whose objects are in the table."""
    out: dict[str, list[str]] = {}
    for family in FAMILIES.values():
        module = family.read_config.__module__
        out.setdefault(module, []).append(family.model_type)
    return {module: " ".join(types) for module, types in out.items()}


def test_every_family_module_is_imported_only_by_the_table_or_other_families():
    known = module_files()
    families = _family_modules()
    assert set(families) <= set(known)
    for name, path in known.items():
        if name == TABLE or name in families:
            continue
        imported = imports_of(name, path, known) & set(families) - {WRITERS.get(name)}
        assert not imported, f"{name} imports the family modules {sorted(imported)}; only {TABLE} may"


def test_the_table_lists_every_family_a_module_defines():
    for module in _family_modules():
        tree = ast.parse(module_files()[module].read_text())
        defined = [
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            for target in node.targets
            if isinstance(target, ast.Name)
            and getattr(node.value.func, "id", "") in ("ModelFamily", "decoder_family", "encoder_decoder_family")
        ]
        table = ast.parse(module_files()[TABLE].read_text())
        listed = {
            node.attr
            for node in ast.walk(table)
            if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == module.rsplit(".", 1)[1]
        }
        assert defined and set(defined) == listed, f"{module} defines {defined}, the table lists {sorted(listed)}"


def test_no_other_module_names_a_family_by_its_model_type():
    families = _family_modules()
    # The fetchable checkpoints' registry names the families of the two models it fetches.
    allowed = {"attnkit.models.checkpoints.registry", "attnkit.models.checkpoints.store"}
    owners = {model_type: module for module, types in families.items() for model_type in types.split()}
    for name, path in module_files().items():
        if name in allowed:
            continue
        constants = {node.value for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Constant)}
        for model_type, owner in owners.items():
            if name != owner:
                assert model_type not in constants, f"{name} names the family {model_type!r} (owned by {owner})"
