"""Chat templates (attnkit.models.checkpoints.chat): a conversation rendered and tokenized
as transformers' apply_chat_template does it, its turns token by token, and the one line
said of a checkpoint without a template; on tiny checkpoints whose template the tests
write into tokenizer_config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnkit.models import load
from attnkit.models.checkpoints.chat import ChatText, parse_messages, read_chat_template
from tests.fixtures.chat import CHATML_TEMPLATE, DEFAULT_SYSTEM_TEMPLATE, TINYLLAMA_TEMPLATE, write_chat_model

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "the cat sat"},
    {"role": "assistant", "content": "a dog ran"},
    {"role": "user", "content": "the mat"},
]


TEMPLATES = {"tinyllama": TINYLLAMA_TEMPLATE, "chatml": CHATML_TEMPLATE, "default-system": DEFAULT_SYSTEM_TEMPLATE}


@pytest.fixture(scope="module", params=list(TEMPLATES))
def chat_folder(request, tmp_path_factory) -> Path:
    template = TEMPLATES[request.param]
    return write_chat_model(tmp_path_factory.mktemp(request.param), template)


@pytest.mark.parametrize("messages", [CONVERSATION, CONVERSATION[1:2], CONVERSATION[:3]])
def test_the_tokens_are_those_of_transformers_apply_chat_template(chat_folder, messages):
    transformers = pytest.importorskip("transformers")
    expected = transformers.AutoTokenizer.from_pretrained(str(chat_folder)).apply_chat_template(
        messages, tokenize=True, add_generation_prompt=messages[-1]["role"] != "assistant", return_dict=False
    )
    chat = load(str(chat_folder)).apply_chat_template(messages)
    assert chat.encoded.ids[0].tolist() == expected


def test_each_token_belongs_to_its_turn_and_the_role_markers_are_the_templates(chat_folder):
    chat = load(str(chat_folder)).apply_chat_template(CONVERSATION)
    tokens = chat.encoded.tokens
    assert [t.role for t in chat.turns] == ["system", "user", "assistant", "user", "assistant"]
    # The turns follow each other; the first starts after a BOS the template writes on its own.
    assert chat.turns[0].start == (1 if tokens[0] == "<s>" else 0)
    assert all(a.stop == b.start for a, b in zip(chat.turns, chat.turns[1:]))
    assert chat.turns[-1].stop == len(tokens)
    contents = [tokens[t.content_start : t.content_stop] for t in chat.turns]
    assert contents == [["Be", "Ġbrief", "."], ["the", "Ġcat", "Ġsat"], ["a", "Ġdog", "Ġran"], ["the", "Ġmat"], []]
    user = chat.turns[1]
    markers = [tokens[i] for i in range(user.start, user.stop) if user.is_marker(i)]
    assert markers[0] in ("<|user|>", "<|im_start|>") and not any(t in ("Ġcat",) for t in markers)


def test_a_default_system_prompt_the_template_writes_is_a_system_turn_of_its_own_tokens(tmp_path):
    model = load(str(write_chat_model(tmp_path / "default-system", DEFAULT_SYSTEM_TEMPLATE)))
    chat = model.apply_chat_template("the cat sat")
    tokens = chat.encoded.tokens
    assert [t.role for t in chat.turns] == ["system", "user", "assistant"]
    system, user = chat.turns[:2]
    assert tokens[system.start : system.stop] == ["<|im_start|>", "system", "Ċ", "Be", "Ġbrief", ".", "<|im_end|>", "Ċ"]
    assert all(system.is_marker(i) for i in range(system.start, system.stop))
    assert tokens[user.start] == "<|im_start|>" and tokens[user.content_start : user.content_stop] == [
        "the",
        "Ġcat",
        "Ġsat",
    ]
    with_system = model.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "the cat sat"}]
    )
    assert with_system == chat and with_system.turns[0].content_stop - with_system.turns[0].content_start == 3


def test_positions_count_the_templates_tokens(chat_folder):
    model = load(str(chat_folder))
    chat = model.apply_chat_template("the cat sat")
    run = model.run(chat, return_weights=[0], logits=False)
    assert run.tokens == chat.encoded.tokens and len(run.tokens) > len(model.tokenize("the cat sat").tokens)
    assert model.get_token_position(" cat", chat) == chat.encoded.tokens.index("Ġcat")
    assert str(chat) == "".join(model.to_str_tokens(chat))


def test_a_message_a_json_list_and_a_list_give_one_conversation(chat_folder):
    model = load(str(chat_folder))
    one = model.apply_chat_template("the cat sat")
    assert one == model.apply_chat_template([{"role": "user", "content": "the cat sat"}])
    assert one == model.apply_chat_template(json.dumps([{"role": "user", "content": "the cat sat"}]))
    assert isinstance(one, ChatText) and one.messages[0].role == "user"


def test_a_checkpoint_without_a_template_says_so_in_one_line(tmp_path):
    model = load(str(write_chat_model(tmp_path / "plain", template=None)))
    with pytest.raises(ValueError) as err:
        model.apply_chat_template("the cat sat")
    message = str(err.value)
    assert "\n" not in message and "has no chat template" in message and "plain text" in message


def test_chat_template_jinja_comes_before_tokenizer_config(tmp_path):
    folder = write_chat_model(tmp_path / "both")
    (folder / "chat_template.jinja").write_text(CHATML_TEMPLATE)
    assert read_chat_template(folder) == CHATML_TEMPLATE
    named = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": TINYLLAMA_TEMPLATE}]
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text()) | {"chat_template": named}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert read_chat_template(folder) == TINYLLAMA_TEMPLATE


@pytest.mark.parametrize(
    "bad, said",
    [
        ("[not json", "not valid JSON"),
        ('[{"role": "user"}]', "message 0 must be an object with a string role and content"),
        ("[]", "expected a message, or a JSON list"),
    ],
)
def test_messages_that_are_not_messages_are_refused(bad, said):
    with pytest.raises(ValueError, match=said):
        parse_messages(bad)


def test_a_template_that_refuses_the_messages_is_an_error_that_names_the_model(tmp_path):
    refusing = "{{ raise_exception('Conversation roles must alternate user/assistant') }}"
    model = load(str(write_chat_model(tmp_path / "refusing", refusing)))
    with pytest.raises(ValueError, match="refuses these messages: Conversation roles must alternate"):
        model.apply_chat_template("the cat sat")
