"""How a checkpoint arrives: the models known by name (:mod:`~.registry`), fetched into the
model store (:mod:`~.store`) or found in the Hugging Face cache (:mod:`~.hub`); a folder's
files read and checked (:mod:`~.files`, :mod:`~.weights`, :mod:`~.manifest`), its
``config.json`` read field by field (:mod:`~.config_reader`), its tensors renamed
(:mod:`~.renaming`), its tokenizer (:mod:`~.tokenizer`), and whether it fits in memory
(:mod:`~.memory`).

Nothing here imports a family or the :class:`~attnkit.models.Model`; importing the package
imports nothing, so that the command line reads :mod:`~.registry` without PyTorch.
"""
