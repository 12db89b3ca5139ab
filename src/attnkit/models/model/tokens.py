"""Tokens of a :class:`attnkit.models.Model`: a text split into its tokens, several texts
padded to one length, the id of one token, the checked input of every run, batch and
generation, and TransformerLens' token helpers (``to_str_tokens``, ``to_string``,
``get_token_position``); a mixin over the attributes listed on :class:`TokensMixin`, so
that it never imports :mod:`attnkit.models.model.model`.

Shape letters: ``b`` batch, ``s`` number of tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, overload

import torch
from torch import Tensor

from attnkit.models.checkpoints.chat import ChatText, apply_chat_template
from attnkit.models.checkpoints.files import read_json_object
from attnkit.models.checkpoints.tokenizer import TokenizedText, Tokenizer
from attnkit.models.families.family import ModelConfig
from attnkit.models.model.core import ModelCore
from attnkit.models.model.running import pad_rows


class TokensMixin(ModelCore):
    """Tokens over the attributes below.

    Attributes (what the mixin reads of its class):
        name: for messages.
        config: its :class:`attnkit.models.families.family.ModelConfig` (the vocabulary size).
        tokenizer: the :class:`attnkit.models.Tokenizer`.
        max_length: the most tokens one text may have.
        path: the checkpoint folder (its chat template, the name of its BOS token).
    """

    name: str
    path: Path
    config: ModelConfig
    tokenizer: Tokenizer
    max_length: int

    @functools.cached_property
    def bos_token_id(self) -> int | None:
        """The beginning-of-sequence token that ``prepend_bos=True`` puts first: the
        ``bos_token`` of the checkpoint's ``tokenizer_config.json`` (what TransformerLens
        prepends), else ``config.json``'s ``bos_token_id``; ``None`` when neither names one."""
        folder = Path(self.path)
        if (folder / "tokenizer_config.json").is_file():
            token = read_json_object(folder / "tokenizer_config.json").get("bos_token")
            token = token.get("content") if isinstance(token, dict) else token
            token_id = self.tokenizer.backend.token_to_id(token) if isinstance(token, str) else None
            if token_id is not None:
                return int(token_id)
        if (folder / "config.json").is_file():
            token_id = read_json_object(folder / "config.json").get("bos_token_id")
            if isinstance(token_id, int) and not isinstance(token_id, bool):
                return token_id
        return None

    def tokenize(self, text: str, *, prepend_bos: bool | None = None) -> TokenizedText:
        """Split a text into the model's tokens (with ``[CLS]``/``[SEP]`` for BERT).

        Args:
            text: a non-empty string.
            prepend_bos: ``None`` tokenizes as the model's tokenizer does (SmolLM2's adds
                nothing, Gemma's a BOS); ``True`` puts the BOS token (:attr:`bos_token_id`)
                first where the tokenizer did not, as TransformerLens does by default;
                ``False`` drops the BOS the tokenizer put first.

        Returns:
            A :class:`attnkit.models.TokenizedText` with ids ``[1, s]``.

        Raises:
            TypeError: ``text`` is not a string.
            ValueError: an empty text, one longer than :attr:`max_length` tokens,
                ``prepend_bos=True`` for a checkpoint that names no BOS token.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        # A conversation rendered by the chat template keeps the tokens it was rendered into.
        encoded = text.encoded if isinstance(text, ChatText) else self.tokenizer.encode(text)
        if not text or all(encoded.special):
            raise ValueError(f"text is empty: {self.name} needs at least one token, got {text!r}")
        if prepend_bos is not None:
            encoded = self._with_bos(encoded, prepend_bos)
        self._check_length(len(encoded))
        self._check_vocabulary(encoded.ids)
        return encoded

    def tokenized(self, text_or_ids: str | Tensor | Sequence[int], *, prepend_bos: bool | None = None) -> TokenizedText:
        """A text's tokens (:meth:`tokenize`), or token ids ``[s]`` / ``[1, s]`` as a
        :class:`attnkit.models.TokenizedText` (the tokenizer's strings, empty spans, none
        special): what the analyses that take a text or ids read.

        Raises:
            TypeError, ValueError: what :meth:`prepare_input` refuses.
        """
        if isinstance(text_or_ids, str):
            return self.tokenize(text_or_ids, prepend_bos=prepend_bos)
        ids, tokens, _ = self.prepare_input(text_or_ids)
        return TokenizedText(ids, tokens, [(0, 0)] * len(tokens), [False] * len(tokens))

    def _with_bos(self, encoded: TokenizedText, prepend_bos: bool) -> TokenizedText:
        """``encoded`` with the BOS token first (``True``) or without a leading one (``False``)."""
        bos = self.bos_token_id
        starts_with_bos = bos is not None and encoded.special[0] and int(encoded.ids[0, 0]) == bos
        if prepend_bos == starts_with_bos:
            return encoded
        if not prepend_bos:
            return TokenizedText(encoded.ids[:, 1:], encoded.tokens[1:], encoded.offsets[1:], encoded.special[1:])
        if bos is None:
            raise ValueError(f"prepend_bos=True needs a BOS token, but {self.name}'s checkpoint names none")
        ids = torch.cat([torch.tensor([[bos]], dtype=encoded.ids.dtype), encoded.ids], dim=1)  # [1, 1 + s]
        token = self.tokenizer.id_to_token(bos)
        return TokenizedText(ids, [token, *encoded.tokens], [(0, 0), *encoded.offsets], [True, *encoded.special])

    def apply_chat_template(
        self, messages: str | Sequence[Mapping[str, Any]], *, add_generation_prompt: bool | None = None
    ) -> ChatText:
        """A conversation in the checkpoint's chat template, as the chat model reads it
        (:func:`attnkit.models.checkpoints.chat.apply_chat_template`): a text every run,
        map and viewer takes, whose positions count the template's tokens.

        Args:
            messages: one user message, or a list (or JSON list) of ``{"role", "content"}``.
            add_generation_prompt: end with the prompt of the assistant's reply; default
                when the last message is not the assistant's.

        Raises:
            ValueError: a checkpoint without a chat template (one line that says so),
                messages that are not messages, or more tokens than the model reads.
        """
        chat = apply_chat_template(
            Path(self.path), self.tokenizer, messages, name=self.name, add_generation_prompt=add_generation_prompt
        )
        self.tokenize(chat)
        return chat

    @overload
    def to_tokens(
        self,
        texts: str | Sequence[str],
        *,
        padding_side: Literal["right", "left"] = "right",
        prepend_bos: bool | None = None,
        return_mask: Literal[True] = True,
    ) -> tuple[Tensor, Tensor]: ...

    @overload
    def to_tokens(
        self,
        texts: str | Sequence[str],
        *,
        padding_side: Literal["right", "left"] = "right",
        prepend_bos: bool | None = None,
        return_mask: Literal[False],
    ) -> Tensor: ...

    def to_tokens(
        self,
        texts: str | Sequence[str],
        *,
        padding_side: Literal["right", "left"] = "right",
        prepend_bos: bool | None = None,
        return_mask: bool = True,
    ) -> tuple[Tensor, Tensor] | Tensor:
        """Token ids of one text or several, padded to one length.

        Args:
            texts: a text or a list of texts.
            padding_side: where shorter texts are padded (with id 0).
            prepend_bos: as :meth:`tokenize` takes it (``True``: TransformerLens' default).
            return_mask: ``False`` returns the ids alone, as TransformerLens' ``to_tokens``.

        Returns:
            ``(ids [b, s], attention_mask [b, s])``, the mask ``True`` on tokens and
            ``False`` on padding: what :meth:`run_with_hooks` takes; the ids ``[b, s]``
            alone with ``return_mask=False``.

        Raises:
            TypeError, ValueError: what :meth:`tokenize` refuses, an empty list, an
                unknown ``padding_side``.
        """
        if padding_side not in ("right", "left"):
            raise ValueError(f'padding_side must be "right" or "left", got {padding_side!r}')
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            raise ValueError("to_tokens needs at least one text, got an empty list")
        rows = [self.tokenize(text, prepend_bos=prepend_bos).ids[0] for text in texts]
        ids, mask = pad_rows(rows, max(len(row) for row in rows), padding_side)
        return (ids, mask) if return_mask else ids

    def to_single_token(self, token: str, *, what: str = "token") -> int:
        """The id of the one token that spells ``token``.

        Args:
            token: the token's text, leading space included where the word follows a space
                (``" Paris"``).
            what: what the token is, for the message (``"target"``, ``"wrong"``).

        Returns:
            The token id.

        Raises:
            ValueError: ``token`` is empty or is not exactly one token; the message says how
                it tokenises.
        """
        if not isinstance(token, str) or not token:
            raise ValueError(f"the {what} must be a non-empty string, got {token!r}")
        encoded = self.tokenizer.encode(token)
        pieces = [
            (i, t) for i, t, special in zip(encoded.ids[0].tolist(), encoded.tokens, encoded.special) if not special
        ]
        if len(pieces) != 1:
            spelled = " + ".join(repr(t) for _, t in pieces) or "no token"
            hint = (
                ""
                if token.startswith(" ")
                else f"; a word after a space is its own token with the space: {' ' + token!r}"
            )
            raise ValueError(
                f"the {what} {token!r} must be a single token of {self.name}, but it tokenises as {spelled} "
                f"({len(pieces)} tokens){hint}"
            )
        return pieces[0][0]

    def prepare_input(
        self, text_or_ids: str | Tensor | Sequence[int], *, prepend_bos: bool | None = None
    ) -> tuple[Tensor, list[str], list[tuple[int, int]] | None]:
        """The model's input for a text or for token ids, validated: what every run, batch
        and generation (of this model and of an encoder-decoder's source and target) reads.

        Args:
            text_or_ids: a text, or token ids ``[s]`` / ``[1, s]`` (a tensor or a sequence).
            prepend_bos: for a text, as :meth:`tokenize` takes it; ids are taken as they are.

        Returns:
            ``(ids [1, s], tokens, offsets)``: ``offsets`` are the tokens' character spans
            in a text, ``None`` for ids.

        Raises:
            TypeError: ids that are not integers.
            ValueError: ids of another shape, none at all, outside the vocabulary, or more
                tokens than the model reads.
        """
        if isinstance(text_or_ids, str):
            encoded = self.tokenize(text_or_ids, prepend_bos=prepend_bos)
            return encoded.ids, encoded.tokens, encoded.offsets
        if not isinstance(text_or_ids, Tensor) and len(text_or_ids) == 0:
            raise ValueError(f"no input: {self.name} needs a text, a list of texts or token ids, got an empty list")
        ids = text_or_ids if isinstance(text_or_ids, Tensor) else torch.tensor(list(text_or_ids))
        if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
            raise TypeError(f"token ids must be integers, got dtype {ids.dtype}")
        if ids.ndim == 1:
            ids = ids.unsqueeze(0)
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise ValueError(f"token ids must be [s] or [1, s], got {list(ids.shape)}")
        if ids.shape[1] == 0:
            raise ValueError(f"no token ids: {self.name} needs at least one token")
        self._check_length(ids.shape[1])
        self._check_vocabulary(ids)
        ids = ids.long().cpu()
        return ids, [self.tokenizer.id_to_token(i) for i in ids[0].tolist()], None

    def _check_vocabulary(self, ids: Tensor) -> None:
        """Refuse ids outside the embedding's rows: on a GPU such an id is a device-side
        assert, not an error."""
        vocab = self.config.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"token ids must be in [0, {vocab}), got [{int(ids.min())}, {int(ids.max())}]")

    def _check_length(self, n: int) -> None:
        if n > self.max_length:
            raise ValueError(f"text is {n} tokens long; {self.name} reads at most {self.max_length} tokens")

    def to_str_tokens(self, text_or_ids: str | Tensor | Sequence[int], *, prepend_bos: bool | None = None) -> list[str]:
        """Each token decoded on its own (``" Paris"``, not the tokenizer's ``"ĠParis"``), as
        TransformerLens' ``to_str_tokens``.

        Args:
            text_or_ids: a text (tokenized with the model's special tokens, no BOS added
                otherwise), or ids ``[s]`` / ``[1, s]``.
            prepend_bos: for a text, as :meth:`tokenize` takes it.

        Returns:
            ``s`` strings.

        Raises:
            TypeError, ValueError: what :meth:`prepare_input` refuses.
        """
        ids = self.prepare_input(text_or_ids, prepend_bos=prepend_bos)[0][0].tolist()
        return [self.tokenizer.decode([i]) for i in ids]

    def to_string(self, ids: Tensor | Sequence[int]) -> str | list[str]:
        """The text of token ids: ``[s]`` gives a string, ``[b, s]`` a list of strings.

        Raises:
            ValueError: ids of more than 2 dimensions.
        """
        ids = ids if isinstance(ids, Tensor) else torch.tensor(list(ids))
        if ids.ndim == 1:
            return self.tokenizer.decode(ids.tolist())
        if ids.ndim == 2:
            return [self.tokenizer.decode(row.tolist()) for row in ids]
        raise ValueError(f"ids must be [s] or [b, s], got {list(ids.shape)}")

    def get_token_position(
        self,
        token: str | int,
        text_or_ids: str | Tensor | Sequence[int],
        *,
        mode: Literal["first", "last"] = "first",
        prepend_bos: bool | None = None,
    ) -> int:
        """The position of a token in a text, as TransformerLens' ``get_token_position``.

        Args:
            token: one token's text (``" Paris"``, :meth:`to_single_token`) or id.
            text_or_ids: the text or ids to look in.
            mode: its ``"first"`` or ``"last"`` occurrence.
            prepend_bos: for a text, as :meth:`tokenize` takes it (``True`` counts
                positions as TransformerLens does by default).

        Returns:
            The position, from 0.

        Raises:
            ValueError: a token that is not one token, that does not occur, an unknown mode.
        """
        if mode not in ("first", "last"):
            raise ValueError(f'mode must be "first" or "last", got {mode!r}')
        token_id = self.to_single_token(token) if isinstance(token, str) else int(token)
        ids = self.prepare_input(text_or_ids, prepend_bos=prepend_bos)[0][0].tolist()
        found = [i for i, t in enumerate(ids) if t == token_id]
        if not found:
            raise ValueError(f"token {token!r} (id {token_id}) does not occur in the {len(ids)} tokens")
        return found[0] if mode == "first" else found[-1]
