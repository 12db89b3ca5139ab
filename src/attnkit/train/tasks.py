"""Toy tasks that a small Transformer learns from scratch in minutes on a CPU, generated
on the fly from a seeded :class:`torch.Generator` (nothing to download).

Shape letters: ``n`` examples, ``s_in`` input length, ``s_out`` target length.

- ``copy``, ``reverse``, ``sort`` (sequence to sequence): the input is ``length`` symbols
  drawn uniformly from ``symbols``; the target is the same sequence, reversed or sorted.
  Reversing is the classic test of cross-attention: output ``i`` must look at input
  ``length - 1 - i``, so a trained head draws the anti-diagonal.
- ``addition`` (decoder-only): the input is ``"a+b="`` with both numbers written with
  ``digits`` digits (zero-padded) and the target the sum with ``digits + 1`` digits.

Every target ends with the end-of-sequence token, and decoding starts from the
beginning-of-sequence token; lengths are fixed per task, so nothing needs padding.

Held-out examples never occur in training: each input falls on one side of a fixed split
by a hash of its tokens (one input in :data:`HELD_OUT_EVERY` is held out), and the held-out
stream is also drawn from a different seed. This matters for small input spaces (short
sequences, few digits) where random training batches would otherwise cover the test set.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

BOS, EOS = 0, 1
SPECIAL_TOKENS = ("<s>", "</s>")

# One input in HELD_OUT_EVERY belongs to the held-out side of the split.
HELD_OUT_EVERY = 10
# Fewer distinct inputs than this leave too few held-out ones to measure anything.
MIN_DISTINCT_INPUTS = 1000

# Constants of the split's hash: a polynomial hash modulo a Mersenne prime, then a
# multiplicative mix so that the held-out bucket does not follow the last token.
_HASH_BASE = 1_000_003
_HASH_PRIME = 2**31 - 1
_HASH_MIX = 2_654_435_761


@dataclass(frozen=True)
class Batch:
    """Examples of a task.

    Attributes:
        inputs: token ids ``[n, s_in]`` (the source, or the prompt of a decoder-only task).
        targets: token ids ``[n, s_out]``, the answer followed by :data:`EOS`.
    """

    inputs: Tensor
    targets: Tensor

    def to(self, device: torch.device | str) -> Batch:
        """The same batch on ``device``."""
        return Batch(self.inputs.to(device), self.targets.to(device))


def held_out_side(inputs: Tensor) -> Tensor:
    """Which inputs belong to the held-out side of the split.

    Args:
        inputs: token ids ``[n, s_in]``.

    Returns:
        bool ``[n]``, a fixed function of each row's tokens.
    """
    h = torch.zeros(inputs.shape[0], dtype=torch.int64, device=inputs.device)
    for column in inputs.long().unbind(dim=1):
        # h < 2^31 and the base < 2^20: the product stays far below int64 overflow.
        h = (h * _HASH_BASE + column) % _HASH_PRIME
    mixed = (h * _HASH_MIX) % 2**32  # [n]
    return (mixed >> 16) % HELD_OUT_EVERY == 0


class Task(ABC):
    """A toy task: its vocabulary, how to draw inputs and how to answer them.

    Attributes:
        name: the task's name on the command line.
        decoder_only: trained with a decoder-only LM over ``<s> input target`` instead of an
            encoder–decoder.
        alignment: the name of the input position each output token comes from
            (``"diagonal"``, ``"anti-diagonal"``), or ``None`` when there is no fixed one.
        vocab: the token strings; the id of a token is its index.
    """

    name: ClassVar[str]
    decoder_only: ClassVar[bool] = False
    alignment: ClassVar[str | None] = None
    vocab: list[str]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    @abstractmethod
    def input_length(self) -> int:
        """``s_in``."""

    @property
    @abstractmethod
    def target_length(self) -> int:
        """``s_out``, counting the final :data:`EOS`."""

    @property
    @abstractmethod
    def distinct_inputs(self) -> int:
        """How many different inputs the task has."""

    @abstractmethod
    def _draw_inputs(self, n: int, generator: torch.Generator) -> Tensor:
        """``n`` uniformly drawn inputs ``[n, s_in]``."""

    @abstractmethod
    def _answers(self, inputs: Tensor) -> Tensor:
        """The answers ``[n, s_out - 1]`` to ``inputs``, without the EOS."""

    def sample(self, n: int, generator: torch.Generator, *, held_out: bool = False) -> Batch:
        """Draw ``n`` examples from one side of the train/held-out split.

        Inputs from the other side are drawn and dropped, so the result is a deterministic
        function of the generator's state.

        Args:
            n: the number of examples.
            generator: a CPU generator; the examples are made on the CPU.
            held_out: draw from the held-out side instead of the training side.

        Returns:
            A :class:`Batch` of ``n`` examples.
        """
        kept: list[Tensor] = []
        count = 0
        while count < n:
            candidates = self._draw_inputs(n, generator)  # [n, s_in]
            chosen = candidates[held_out_side(candidates) == held_out]  # [n', s_in]
            kept.append(chosen)
            count += chosen.shape[0]
        inputs = torch.cat(kept)[:n]  # [n, s_in]
        eos = torch.full((n, 1), EOS, dtype=inputs.dtype)
        return Batch(inputs, torch.cat((self._answers(inputs), eos), dim=1))  # targets [n, s_out]

    def aligned_keys(self) -> Tensor | None:
        """For tasks with an :attr:`alignment`: the input position that output token ``i``
        copies, ``[s_out - 1]`` (the EOS has none); else ``None``."""
        return None

    def tokens(self, ids: Tensor | Sequence[int]) -> list[str]:
        """The strings of token ids ``[s]``."""
        return [self.vocab[int(i)] for i in ids]

    def _check_distinct_inputs(self, description: str) -> None:
        if self.distinct_inputs < MIN_DISTINCT_INPUTS:
            raise ValueError(
                f"{self.name} with {description} has only {self.distinct_inputs} distinct inputs; at least "
                f"{MIN_DISTINCT_INPUTS} are needed so that held-out inputs (1 in {HELD_OUT_EVERY}) differ from "
                "training ones"
            )


class SequenceTask(Task):
    """Sequence-to-sequence over ``symbols`` symbols named ``"0"``, ``"1"``, …; the answer
    has the input's length.

    Args:
        length: the input length.
        symbols: the number of distinct symbols.

    Raises:
        ValueError: ``length < 1``, ``symbols < 2``, or too few distinct inputs to hold
            some out.
    """

    def __init__(self, length: int = 16, symbols: int = 32) -> None:
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        if symbols < 2:
            raise ValueError(f"symbols must be >= 2, got {symbols}")
        self.length = length
        self.symbols = symbols
        self.vocab = [*SPECIAL_TOKENS, *(str(i) for i in range(symbols))]
        self._check_distinct_inputs(f"length {length} over {symbols} symbols")

    @property
    def input_length(self) -> int:
        return self.length

    @property
    def target_length(self) -> int:
        return self.length + 1

    @property
    def distinct_inputs(self) -> int:
        return self.symbols**self.length

    def _draw_inputs(self, n: int, generator: torch.Generator) -> Tensor:
        first = len(SPECIAL_TOKENS)
        return torch.randint(first, first + self.symbols, (n, self.length), generator=generator)  # [n, s_in]


class CopyTask(SequenceTask):
    """Output the input unchanged."""

    name = "copy"
    alignment = "diagonal"

    def aligned_keys(self) -> Tensor:
        return torch.arange(self.length)

    def _answers(self, inputs: Tensor) -> Tensor:
        return inputs.clone()


class ReverseTask(SequenceTask):
    """Output the input backwards."""

    name = "reverse"
    alignment = "anti-diagonal"

    def aligned_keys(self) -> Tensor:
        return torch.arange(self.length - 1, -1, -1)

    def _answers(self, inputs: Tensor) -> Tensor:
        return inputs.flip(1)


class SortTask(SequenceTask):
    """Output the input's symbols in increasing order."""

    name = "sort"

    def _answers(self, inputs: Tensor) -> Tensor:
        # Symbol ids increase with the symbols' values, so sorting ids sorts symbols.
        return inputs.sort(dim=1).values


class AdditionTask(Task):
    """``a+b=`` → ``a + b``, every number in decimal with a fixed number of digits.

    Args:
        digits: the digits of each operand; the sum gets ``digits + 1``.

    Raises:
        ValueError: ``digits < 1`` or too few distinct inputs to hold some out.
    """

    name = "addition"
    decoder_only = True

    def __init__(self, digits: int = 3) -> None:
        if digits < 1:
            raise ValueError(f"digits must be >= 1, got {digits}")
        self.digits = digits
        self.vocab = [*SPECIAL_TOKENS, *(str(d) for d in range(10)), "+", "="]
        self._zero = self.vocab.index("0")
        self._check_distinct_inputs(f"{digits} digits")

    @property
    def input_length(self) -> int:
        return 2 * self.digits + 2

    @property
    def target_length(self) -> int:
        return self.digits + 2

    @property
    def distinct_inputs(self) -> int:
        return 10 ** (2 * self.digits)

    def _digits(self, numbers: Tensor, width: int) -> Tensor:
        """Token ids of ``numbers`` ``[n]``, most significant digit first: ``[n, width]``."""
        powers = 10 ** torch.arange(width - 1, -1, -1)  # [width]
        return (numbers[:, None] // powers) % 10 + self._zero  # [n, width]

    def _number(self, digit_ids: Tensor) -> Tensor:
        """The numbers written by token ids ``[n, width]``: ``[n]``."""
        width = digit_ids.shape[1]
        powers = 10 ** torch.arange(width - 1, -1, -1, device=digit_ids.device)  # [width]
        return ((digit_ids - self._zero) * powers).sum(dim=1)

    def _draw_inputs(self, n: int, generator: torch.Generator) -> Tensor:
        a = torch.randint(0, 10**self.digits, (n,), generator=generator)
        b = torch.randint(0, 10**self.digits, (n,), generator=generator)
        plus = torch.full((n, 1), self.vocab.index("+"))
        equals = torch.full((n, 1), self.vocab.index("="))
        return torch.cat((self._digits(a, self.digits), plus, self._digits(b, self.digits), equals), dim=1)

    def _answers(self, inputs: Tensor) -> Tensor:
        a = self._number(inputs[:, : self.digits])
        b = self._number(inputs[:, self.digits + 1 : 2 * self.digits + 1])
        return self._digits(a + b, self.digits + 1)  # [n, digits + 1]


TASKS: dict[str, type[Task]] = {t.name: t for t in (CopyTask, ReverseTask, SortTask, AdditionTask)}


def make_task(name: str, *, length: int = 16, symbols: int = 32, digits: int = 3) -> Task:
    """Build a task by name.

    Args:
        name: one of :data:`TASKS`.
        length: input length of the sequence tasks.
        symbols: symbols of the sequence tasks.
        digits: digits per operand of ``addition``.

    Returns:
        The task.

    Raises:
        ValueError: an unknown name or invalid sizes.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; expected one of {', '.join(TASKS)}")
    task = TASKS[name]
    if issubclass(task, SequenceTask):
        return task(length, symbols)
    return AdditionTask(digits)
