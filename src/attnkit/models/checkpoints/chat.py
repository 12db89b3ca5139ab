"""Chat templates: a checkpoint's Jinja template (``chat_template.jinja``, or
``chat_template`` in ``tokenizer_config.json``) applied to messages as Hugging Face's
``apply_chat_template`` applies it, and the turns of the result, token by token.

A :class:`ChatText` is the rendered text (a ``str``) that carries its tokens and turns, so
that every entry point that takes a text takes it: positions count the template's tokens.

Shape letters: ``s`` number of tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from attnkit.models.checkpoints.tokenizer import TokenizedText, Tokenizer

# The special tokens a template may name (``{{ bos_token }}``), as transformers passes them.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
MESSAGES_HELP = (
    'a message, or a JSON list of messages such as [{"role": "user", "content": "Hi"}] (in a string, or a .json file)'
)


@dataclass(frozen=True)
class Message:
    """One message of a conversation: ``role`` (``"system"``, ``"user"``, ``"assistant"``,
    ...) and its ``content``."""

    role: str
    content: str


@dataclass(frozen=True)
class Turn:
    """One message's tokens in the rendered conversation.

    Attributes:
        role: the message's role; ``"assistant"`` for the generation prompt (where the
            reply starts) after the last message.
        start: its first token.
        stop: one past its last token.
        content_start: the first token of the message's own text (``content_start ==
            content_stop`` when it has none, as the generation prompt).
        content_stop: one past the last token of its text. The turn's other tokens are the
            template's: role markers and separators. A default system prompt that the
            template writes before a conversation without a system message is a turn of
            role ``"system"`` without content: every token of it is the template's.
    """

    role: str
    start: int
    stop: int
    content_start: int
    content_stop: int

    def is_marker(self, token: int) -> bool:
        """Whether a token of this turn is the template's rather than the message's."""
        return not self.content_start <= token < self.content_stop

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "start": self.start,
            "stop": self.stop,
            "content_start": self.content_start,
            "content_stop": self.content_stop,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Turn:
        return cls(str(d["role"]), int(d["start"]), int(d["stop"]), int(d["content_start"]), int(d["content_stop"]))


class ChatText(str):
    """A conversation rendered by a chat template: the text itself, and

    Attributes:
        messages: the messages rendered.
        encoded: its tokens (the template's special tokens included, none added around it).
        turns: each message's :class:`Turn`, then the generation prompt's when there is one.
    """

    messages: tuple[Message, ...]
    encoded: TokenizedText
    turns: tuple[Turn, ...]

    def __new__(cls, text: str, messages: Sequence[Message], encoded: TokenizedText, turns: Sequence[Turn]) -> ChatText:
        made = super().__new__(cls, text)
        made.messages = tuple(messages)
        made.encoded = encoded
        made.turns = tuple(turns)
        return made

    def turns_over(self, groups: Sequence[Sequence[int]]) -> tuple[Turn, ...]:
        """The turns over groups of tokens (the words of a word map): a group belongs to the
        turn of its first token, and is the message's text if any of its tokens is.

        Args:
            groups: each group's token indices, in order.
        """
        turns = []
        for turn in self.turns:
            inside = [g for g, tokens in enumerate(groups) if tokens and turn.start <= tokens[0] < turn.stop]
            if not inside:
                continue
            content = [g for g in inside if any(not turn.is_marker(t) for t in groups[g])]
            first = content[0] if content else inside[-1] + 1
            last = content[-1] + 1 if content else inside[-1] + 1
            turns.append(Turn(turn.role, inside[0], inside[-1] + 1, first, last))
        return tuple(turns)


def parse_messages(value: str | Sequence[Mapping[str, Any]]) -> list[Message]:
    """The messages of ``chat=``/``--chat``: one user message, or a list of them.

    Args:
        value: a text (one user message), a JSON list of ``{"role", "content"}`` objects
            (a string that starts with ``[``), or such a list in Python.

    Raises:
        ValueError: JSON that does not parse, or a list of other things than messages with
            a string role and content.
    """
    if isinstance(value, str):
        if not value.lstrip().startswith("["):
            return [Message("user", value)]
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"the messages are not valid JSON: {err}; give {MESSAGES_HELP}") from None
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ValueError(f"expected {MESSAGES_HELP}, got {type(value).__name__}")
    messages = []
    for i, item in enumerate(value):
        if not (
            isinstance(item, Mapping) and isinstance(item.get("role"), str) and isinstance(item.get("content"), str)
        ):
            raise ValueError(f"message {i} must be an object with a string role and content, got {item!r}")
        messages.append(Message(item["role"], item["content"]))
    return messages


def read_chat_template(folder: Path) -> str | None:
    """A checkpoint's chat template: ``chat_template.jinja``, else ``tokenizer_config.json``'s
    ``chat_template`` (a string, or a list of named templates whose ``"default"`` is taken);
    ``None`` when it has none."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = _tokenizer_config(folder).get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _tokenizer_config(folder: Path) -> dict[str, Any]:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return {}
    config = json.loads(path.read_text(encoding="utf-8"))
    return config if isinstance(config, dict) else {}


def special_tokens(folder: Path) -> dict[str, str]:
    """The special tokens ``tokenizer_config.json`` names (``bos_token``: ``"<s>"``), as a
    template reads them."""
    config = _tokenizer_config(folder)
    found = {}
    for name in SPECIAL_TOKEN_NAMES:
        token = config.get(name)
        token = token.get("content") if isinstance(token, Mapping) else token
        if isinstance(token, str):
            found[name] = token
    return found


def no_template_message(name: str) -> str:
    """The one line said of a checkpoint without a chat template."""
    return f"{name} has no chat template (no chat_template.jinja, nor chat_template in tokenizer_config.json): read the plain text instead (without --chat or chat=)"


def apply_chat_template(
    folder: Path,
    tokenizer: Tokenizer,
    messages: str | Sequence[Mapping[str, Any]],
    *,
    name: str,
    add_generation_prompt: bool | None = None,
) -> ChatText:
    """Render ``messages`` with the chat template of the checkpoint in ``folder`` and
    tokenize the result without adding special tokens (the template writes them), as
    transformers' ``apply_chat_template(..., tokenize=True)`` does.

    Args:
        folder: the checkpoint folder.
        tokenizer: its tokenizer.
        messages: see :func:`parse_messages`.
        name: the model's name, for messages.
        add_generation_prompt: end with the prompt of the assistant's reply; default when
            the last message is not the assistant's.

    Returns:
        The :class:`ChatText`.

    Raises:
        ValueError: no chat template (:func:`no_template_message`), messages that
            :func:`parse_messages` refuses, or a template that fails on them.
    """
    template = read_chat_template(folder)
    if template is None:
        raise ValueError(no_template_message(name))
    parsed = parse_messages(messages)
    if add_generation_prompt is None:
        add_generation_prompt = parsed[-1].role != "assistant"
    render = _compiled(template, special_tokens(folder), name)
    text = render(parsed, add_generation_prompt)
    encoded = tokenizer.encode(text, add_special_tokens=False)
    bounds = _turn_bounds(render, parsed, text)
    inserted = _inserted_system_end(render, parsed, text, bounds[0], add_generation_prompt)
    return ChatText(text, parsed, encoded, _turns(text, parsed, bounds, encoded.offsets, inserted))


def _compiled(template: str, special: Mapping[str, str], name: str) -> Any:
    """``render(messages, add_generation_prompt) -> str``: the template in the sandboxed
    Jinja environment transformers renders chat templates in (trimmed blocks, loop
    controls, ``tojson``, ``raise_exception``, ``strftime_now``)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template)
    except jinja2.exceptions.TemplateError as err:
        raise ValueError(f"the chat template of {name} is not valid Jinja: {err}") from None

    def render(messages: Sequence[Message], add_generation_prompt: bool) -> str:
        chat = [{"role": m.role, "content": m.content} for m in messages]
        try:
            return compiled.render(messages=chat, add_generation_prompt=add_generation_prompt, **special)
        except jinja2.exceptions.TemplateError as err:
            raise ValueError(f"the chat template of {name} refuses these messages: {err}") from None

    return render


def _turn_bounds(render: Any, messages: Sequence[Message], text: str) -> list[int]:
    """The character where each message's turn starts, then where the last one ends: the
    length of the conversation rendered up to it, when that is how ``text`` begins; else
    the end of the message before's content (a template that renders a part differently)."""
    bounds: list[int] = []
    cursor = 0
    for k in range(len(messages) + 1):
        try:
            prefix = render(messages[:k], False)
        except ValueError:
            prefix = None
        if prefix is not None and text.startswith(prefix) and len(prefix) >= (bounds[-1] if bounds else 0):
            bounds.append(len(prefix))
        else:
            bounds.append(max(bounds[-1] if bounds else 0, _content_span(text, messages[k - 1], cursor)[1] if k else 0))
        cursor = bounds[-1]
    return bounds


def _inserted_system_end(
    render: Any, messages: Sequence[Message], text: str, start: int, add_generation_prompt: bool
) -> int:
    """Where a default system prompt that the template writes before a conversation without
    a system message ends (``start`` when it writes none): the conversation rendered after an
    empty system message ends the same way, and its first message starts where that ending
    starts in ``text``."""
    if messages[0].role == "system":
        return start
    empty = Message("system", "")
    try:
        lead, whole = render([empty], False), render([empty, *messages], add_generation_prompt)
    except ValueError:
        return start
    ending = whole[len(lead) :]
    if not whole.startswith(lead) or not text.endswith(ending):
        return start
    return max(start, len(text) - len(ending))


def _content_span(text: str, message: Message, start: int) -> tuple[int, int]:
    """The characters of a message's content in ``text``, searched from ``start`` (then
    stripped of surrounding spaces, as some templates strip it); ``(start, start)`` when it
    is not there."""
    for content in (message.content, message.content.strip()):
        found = text.find(content, start) if content else -1
        if found >= 0:
            return found, found + len(content)
    return start, start


def _turns(
    text: str,
    messages: Sequence[Message],
    bounds: Sequence[int],
    offsets: Sequence[tuple[int, int]],
    inserted_end: int,
) -> list[Turn]:
    """Each message's :class:`Turn` and the generation prompt's, from the characters where
    the turns start (a token belongs to the turn its first character is in); a default
    system prompt the template writes (up to ``inserted_end``) is a system turn of the
    template's own tokens."""
    starts = [start for start, _ in offsets]

    def first_token_at(char: int) -> int:
        return next((i for i, start in enumerate(starts) if start >= char), len(starts))

    spans: list[tuple[str, int, int, Message | None]] = [
        (m.role, inserted_end if k == 0 else bounds[k], bounds[k + 1], m) for k, m in enumerate(messages)
    ]
    if inserted_end > bounds[0]:
        spans.insert(0, ("system", bounds[0], inserted_end, None))
    if bounds[-1] < len(text):
        spans.append(("assistant", bounds[-1], len(text), None))
    turns = []
    for role, begin, end, message in spans:
        first, stop = first_token_at(begin), first_token_at(end)
        if first == stop:
            continue
        char_start, char_end = _content_span(text, message, begin) if message is not None else (end, end)
        if char_end > end:  # found only in a later turn: this one's is not in the text
            char_start = char_end = end
        content = [i for i in range(first, stop) if offsets[i][0] < char_end and offsets[i][1] > char_start]
        content_start, content_stop = (content[0], content[-1] + 1) if content else (stop, stop)
        turns.append(Turn(role, first, stop, content_start, content_stop))
    return turns
