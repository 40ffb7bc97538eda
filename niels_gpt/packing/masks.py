"""The shift that aligns a packed bin's trained-token mask with next-token prediction.

`loss_mask[j]` says whether predicting `input_ids[j+1]` from position j counts (the Megatron-Bridge/Nemotron
convention): the trained mask m shifted left by one *within each packed sequence*, 0 at the last position of
every sequence, so no target crosses a boundary.

    tokens     [usr] h  i [eot] [asst] y  o [eot] | [usr] ...
    m            0   0  0   0     0    1  1   1   |   0
    loss_mask    0   0  0   0     1    1  1   0   |   0
"""

from __future__ import annotations

import numpy as np

LOSS_MASK_CONVENTION = "shift_left_within_sequence"
LOSS_MASK_CONVENTION_TEXT = (
    "loss_mask[j] == 1 iff predicting input_ids[j+1] from position j is trained; shifted within each "
    "packed sequence, the last position of every sequence is 0; padding is 0"
)


def shift_within_sequences(mask, seq_starts, length: int | None = None, out=None) -> np.ndarray:
    """uint8 loss mask: out[j] = mask[j+1] inside each sequence, 0 at each sequence's last position and from
    `length` (default len(mask)) on; `seq_starts` begin with 0."""
    mask = np.asarray(mask)
    length = len(mask) if length is None else int(length)
    if out is None:
        out = np.zeros(len(mask), dtype=np.uint8)
    else:
        out[length:] = 0
    if length == 0:
        return out
    out[:length - 1] = mask[1:length]
    ends = np.append(np.asarray(seq_starts, dtype=np.int64)[1:], length) - 1
    out[ends] = 0
    return out
