"""Each mixin of :class:`attnkit.models.Model` holds one job: the public names of each job
are defined on its mixin, and the Model's own class only holds what it is made of."""

from __future__ import annotations

import pytest

from attnkit.models.model.encoder_decoder import EncoderDecoderMixin
from attnkit.models.model.generation import GenerationMixin
from attnkit.models.model.hooks import HooksMixin
from attnkit.models.model.lens import LensMixin
from attnkit.models.model.model import Model
from attnkit.models.model.running import RunMixin
from attnkit.models.model.tokens import TokensMixin

JOBS: dict[type, set[str]] = {
    RunMixin: {"run", "run_batch"},
    TokensMixin: {
        "tokenize",
        "to_tokens",
        "to_single_token",
        "prepare_input",
        "to_str_tokens",
        "to_string",
        "get_token_position",
    },
    HooksMixin: {"hook_names", "hook_name", "hooks", "run_with_hooks", "run_with_cache", "add_hook", "reset_hooks"},
    GenerationMixin: {"generate_ids", "generate", "generate_stream"},
    EncoderDecoderMixin: {"heads_per_kind", "run_encoder_decoder", "run_encoder_decoder_batch"},
    LensMixin: {"W_E", "W_U", "logit_lens", "logit_attribution", "accumulated_bias", "loss", "unembed"},
}


def _public(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")}


@pytest.mark.parametrize("mixin", list(JOBS), ids=lambda cls: cls.__name__)
def test_a_job_s_names_are_on_its_mixin(mixin: type) -> None:
    assert JOBS[mixin] <= _public(mixin)


def test_the_model_is_made_of_one_mixin_per_job() -> None:
    assert set(JOBS) <= set(Model.__mro__)
    own = {name for name in _public(Model) if callable(getattr(Model, name)) or isinstance(vars(Model)[name], property)}
    # What the Model holds itself: its device, and the old spellings kept for one release.
    assert own == {"device", "architecture", "run_seq2seq", "run_seq2seq_batch"}


def test_no_public_name_is_on_two_mixins() -> None:
    seen: dict[str, str] = {}
    for mixin in JOBS:
        for name in _public(mixin) - {"__annotations__"}:
            assert name not in seen, f"{name} is on {seen.get(name)} and {mixin.__name__}"
            seen[name] = mixin.__name__
