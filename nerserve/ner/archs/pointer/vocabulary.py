"""The pointer decoder's output vocabulary and the grammar its sequences follow (numpy).

Token ids: 0 `<s>` (start; never written), 1 `</s>` (end), 2 `<fragment>` and 3 `<null>` (SetGNER:
the seed word lies inside an entity / outside any), then one id per entity type, then one pointer
per word of the sentence (id = first pointer + word index).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

START, END, FRAGMENT, NULL = 0, 1, 2, 3
SPECIALS = ("<s>", "</s>", "<fragment>", "<null>")


@dataclass(frozen=True)
class Vocabulary:
    labels: tuple[str, ...]

    @property
    def first_type(self) -> int:
        return len(SPECIALS)

    @property
    def first_pointer(self) -> int:
        return len(SPECIALS) + len(self.labels)

    def type_id(self, label: str) -> int:
        return self.first_type + self.labels.index(label)

    def is_type(self, token: int) -> bool:
        return self.first_type <= token < self.first_pointer

    def label(self, token: int) -> str:
        return self.labels[token - self.first_type]

    def pointer(self, word: int) -> int:
        return self.first_pointer + word


def pointer_mask(lengths: np.ndarray, last_word: np.ndarray, width: int) -> np.ndarray:
    """[rows, width] bool: words a row may point to next, strictly after `last_word` (-1: any)
    and inside its sentence (`lengths` words)."""
    words = np.arange(width)[None, :]
    return (words > last_word[:, None]) & (words < lengths[:, None])
