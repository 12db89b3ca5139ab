"""The model families: one file per family (``llama``, ``gemma2``, ``gemma3``, ``qwen2``, …,
``bert``, ``t5``, ``bart``, ``trained``) that reads its ``config.json``, builds its network
from :mod:`attnkit.nn` parts and renames its checkpoint's tensors; the builders the decoder
and encoder–decoder families share; what a family is (:mod:`~attnkit.models.families.family`);
and the table :func:`attnkit.models.load` looks a ``model_type`` up in
(:mod:`~attnkit.models.families.table`).

A family never imports the :class:`~attnkit.models.Model`.
"""
