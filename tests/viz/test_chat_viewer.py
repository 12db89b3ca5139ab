"""A conversation in a chat template in the viewer: the page data carries each message's
turn over the tokens (or words), in the exported page, the notebook viewer and
``attnkit inspect --chat``, on a tiny checkpoint whose template the test writes."""

from __future__ import annotations

import html
import json

import pytest

from attnkit.cli import main
from attnkit.inspect import attention_map, view
from attnkit.models import load
from attnkit.viz.export import viewer_page
from attnkit.viz.notebook import notebook_html_of
from attnkit.viz.viewer import ViewerData
from attnkit.viz.viewer.data import Section
from tests.fixtures.chat import write_chat_model
from tests.viz.test_viewer_data import softmax_maps

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "the cat sat"},
    {"role": "assistant", "content": "a dog ran"},
]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return load(str(write_chat_model(tmp_path_factory.mktemp("chat"))))


def test_the_page_data_holds_the_turns_of_the_template_tokens(chat_model, tmp_path):
    _, data = viewer_page(chat_model, CONVERSATION, tmp_path, chat=True)
    section = data.sections["self"]
    chat = chat_model.apply_chat_template(CONVERSATION)
    assert len(section.query_tokens) == len(chat.encoded.tokens)
    assert section.turns == chat.turns
    assert ViewerData.from_dict(json.loads(data.to_json())).sections["self"].turns == chat.turns


def test_a_word_map_keeps_the_turns_over_its_words(chat_model, tmp_path):
    _, data = viewer_page(chat_model, CONVERSATION, tmp_path, chat=True, level="word")
    section = data.sections["self"]
    assert [t.role for t in section.turns] == ["system", "user", "assistant"]
    words = section.query_tokens
    user = section.turns[1]
    assert words[user.content_start : user.content_stop] == ("the", "cat", "sat")
    assert words[user.start] == "<|user|>"


def test_the_notebook_viewer_shows_the_turns(chat_model):
    for shown in (view(chat_model, CONVERSATION, chat=True), attention_map(chat_model, "the cat sat", chat=True)):
        page = html.unescape(notebook_html_of(shown))
        assert '"turns": [{"role": ' in page or '"turns":[{"role":' in page
    plain = html.unescape(notebook_html_of(view(chat_model, "the cat sat")))
    assert '"turns"' not in plain


def test_turns_must_lie_inside_a_self_attention_section():
    maps = {0: softmax_maps(1, 3, 3)}
    with pytest.raises(ValueError, match="turns must be ordered spans of the 3 tokens"):
        Section.from_layers(
            ["a", "b", "c"],
            ["a", "b", "c"],
            maps,
            turns=[{"role": "user", "start": 1, "stop": 5, "content_start": 1, "content_stop": 2}],
        )


def test_inspect_chat_writes_the_turns_and_counts_the_template_tokens(chat_model, tmp_path, capsys):
    messages = tmp_path / "messages.json"
    messages.write_text(json.dumps(CONVERSATION))
    folder = str(chat_model.path)
    rc = main(
        ["inspect", str(messages), "--chat", "--model", folder, "--format", "html,json", "--out", str(tmp_path), "-q"]
    )
    assert rc == 0
    page = next(tmp_path.glob("*_viewer.html")).read_text()
    assert '"role":"assistant"' in page.replace(" ", "")
    written = json.loads(next(tmp_path.glob("*_layer*.json")).read_text())
    assert len(written["tokens"]) == len(chat_model.apply_chat_template(CONVERSATION).encoded.tokens)
    # --rows counts the template's tokens: the last rows are the assistant's prompt.
    assert (
        main(
            [
                "inspect",
                "the cat sat",
                "--chat",
                "--model",
                folder,
                "--rows=-2:",
                "--format",
                "json",
                "--out",
                str(tmp_path / "rows"),
                "-q",
            ]
        )
        == 0
    )
    assert "<|assistant|>" in capsys.readouterr().out


def test_inspect_chat_on_a_checkpoint_without_a_template_says_so_in_one_line(tmp_path, capsys):
    folder = write_chat_model(tmp_path / "plain", template=None)
    rc = main(
        ["inspect", "the cat sat", "--chat", "--model", str(folder), "--format", "json", "--out", str(tmp_path), "-q"]
    )
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1 and "has no chat template" in err
