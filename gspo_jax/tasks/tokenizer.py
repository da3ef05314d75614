"""Character-level tokenizer shared by the procedurally generated tasks.

Why character level: the tasks are digit strings and tiny expressions; one token per character
keeps prompts and responses short (a few dozen tokens), the vocabulary tiny (a few dozen ids) and
the alignment between a response string and its tokens exact, which the verifiers rely on.

Ids: 0 = pad, 1 = bos, 2 = eos, 3 = unk, then one id per character. ``vocab_size`` is rounded up
to a multiple of 8 so that the vocabulary axis of the embedding and head divides any tensor-parallel
mesh size up to 8; the spare ids never appear in data and decode to "?".

Dimension legend: L = number of tokens in one sequence.
"""

from __future__ import annotations

from collections.abc import Iterable

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
UNK_ID = 3
_NUM_SPECIAL = 4


class CharTokenizer:
    """Maps each character of a fixed alphabet to one id.

    ``encode`` maps characters outside the alphabet to ``unk_id`` (real datasets such as gsm8k may
    hold them); ``decode`` never raises, whatever ids it gets (model output can be anything), and
    drops pad/bos/eos.
    """

    pad_id = PAD_ID
    bos_id = BOS_ID
    eos_id = EOS_ID
    unk_id = UNK_ID

    def __init__(self, alphabet: str, multiple_of: int = 8):
        if len(set(alphabet)) != len(alphabet):
            raise ValueError(f"alphabet has repeated characters: {alphabet!r}; list each once.")
        if multiple_of < 1:
            raise ValueError(f"multiple_of must be >= 1, got {multiple_of}.")
        self.alphabet = alphabet
        self._char_to_id = {c: i + _NUM_SPECIAL for i, c in enumerate(alphabet)}
        n = len(alphabet) + _NUM_SPECIAL
        self.vocab_size = -(-n // multiple_of) * multiple_of

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = [self._char_to_id.get(c, UNK_ID) for c in text]  # [L]
        if add_bos:
            ids = [BOS_ID] + ids
        if add_eos:
            ids = ids + [EOS_ID]
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        chars = []
        for i in ids:
            i = int(i)
            if i in (PAD_ID, BOS_ID, EOS_ID):
                continue
            if i == UNK_ID:
                chars.append("?")
            elif _NUM_SPECIAL <= i < _NUM_SPECIAL + len(self.alphabet):
                chars.append(self.alphabet[i - _NUM_SPECIAL])
            else:
                chars.append("?")
        return "".join(chars)

    def __repr__(self) -> str:
        return f"CharTokenizer(alphabet={self.alphabet!r}, vocab_size={self.vocab_size})"
