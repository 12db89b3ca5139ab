"""Where the modules of ``attnkit.models`` moved when it was grouped into wings: the family
files (:mod:`attnkit.models.families`), how a checkpoint arrives
(:mod:`attnkit.models.checkpoints`) and the :class:`~attnkit.models.Model` users hold
(:mod:`attnkit.models.model`).

Importing ``attnkit.models`` installs :data:`MOVED_MODULES` as an import hook
(:class:`attnkit.deprecation.MovedModules`): an old path still imports, with a
:class:`DeprecationWarning` that names the new one, until attnkit 0.3. Nothing in attnkit
imports an old path.
"""

from __future__ import annotations

from attnkit.deprecation import MovedModules

# Old module path → its new path, or the new paths a split module's names went to.
MOVED_MODULES: dict[str, str | tuple[str, ...]] = {
    # the family files
    "attnkit.models.bart": "attnkit.models.families.bart",
    "attnkit.models.bert": "attnkit.models.families.bert",
    "attnkit.models.gemma2": ("attnkit.models.families.gemma2", "attnkit.models.families.gemma3"),
    "attnkit.models.gpt2": "attnkit.models.families.gpt2",
    "attnkit.models.gpt_neox": "attnkit.models.families.gpt_neox",
    "attnkit.models.llama": "attnkit.models.families.llama",
    "attnkit.models.mistral": "attnkit.models.families.mistral",
    "attnkit.models.phi3": "attnkit.models.families.phi3",
    "attnkit.models.qwen2": "attnkit.models.families.qwen2",
    "attnkit.models.qwen3": "attnkit.models.families.qwen3",
    "attnkit.models.t5": "attnkit.models.families.t5",
    "attnkit.models.trained": "attnkit.models.families.trained",
    "attnkit.models.decoder": "attnkit.models.families.decoder",
    "attnkit.models.family": "attnkit.models.families.family",
    "attnkit.models.family_table": "attnkit.models.families.table",
    # how a checkpoint arrives
    "attnkit.models.registry": "attnkit.models.checkpoints.registry",
    "attnkit.models.store": "attnkit.models.checkpoints.store",
    "attnkit.models.hub": "attnkit.models.checkpoints.hub",
    "attnkit.models.renaming": "attnkit.models.checkpoints.renaming",
    "attnkit.models.config_reader": "attnkit.models.checkpoints.config_reader",
    "attnkit.models.tokenizer": "attnkit.models.checkpoints.tokenizer",
    "attnkit.models.memory": "attnkit.models.checkpoints.memory",
    "attnkit.models.checkpoint": (
        "attnkit.models.checkpoints.errors",
        "attnkit.models.checkpoints.files",
        "attnkit.models.checkpoints.weights",
        "attnkit.models.checkpoints.manifest",
        "attnkit.models.checkpoints.config_reader",
        "attnkit.models.families.meta_device",
    ),
    # the Model users hold
    "attnkit.models.runs": "attnkit.models.model.runs",
    "attnkit.models.batch": "attnkit.models.model.running",
    "attnkit.models.hooks": "attnkit.models.model.hooks",
    "attnkit.models.generation": "attnkit.models.model.generation",
    "attnkit.models.lens": ("attnkit.models.model.lens", "attnkit.models.model.generation"),
    "attnkit.models.core": "attnkit.models.model.core",
    "attnkit.models.encoder_decoder": (
        "attnkit.models.model.encoder_decoder",
        "attnkit.models.families.encoder_decoder",
    ),
    "attnkit.models.attentions": "attnkit.models.model.attentions",
}

REMOVED_IN = "0.3"


def install() -> None:
    """Keep the old paths importable (idempotent)."""
    MovedModules(MOVED_MODULES, removed_in=REMOVED_IN).install()
