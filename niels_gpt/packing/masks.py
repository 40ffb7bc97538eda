"""Trained-token masks for packed SFT, and the shift that aligns them with next-token prediction.

The SFT cache stores no mask (unless a chat template rendered it). A token is a trained target iff it
lies in an assistant span: after an assistant sentinel, up to and including the next EOT. That rule is
`niels_gpt.spans.assistant_token_mask`, applied to a whole packed bin with the span
state reset at every sequence start, so a sequence cut inside an assistant turn never opens a span in
the sequence after it.

Packed-bin convention (the one the shipped Megatron-Bridge/Nemotron code uses, DESIGN.md):
`loss_mask[j]` says whether predicting `input_ids[j+1]` from position j counts. It is the trained mask
shifted left by one *within each packed sequence*: `loss_mask[j] = m[j+1]` for j < end-1 and
`loss_mask[end-1] = 0` at the last position of every sequence, so no target crosses a boundary.

    tokens     [usr] h  i [eot] [asst] y  o [eot] | [usr] ...
    m            0   0  0   0     0    1  1   1   |   0
    loss_mask    0   0  0   0     1    1  1   0   |   0

Cost: O(len) numpy work per call, allocation O(len); used per bin it is O(pack_size).
"""

from __future__ import annotations

import numpy as np

LOSS_MASK_CONVENTION = "shift_left_within_sequence"
LOSS_MASK_CONVENTION_TEXT = (
    "loss_mask[j] == 1 iff predicting input_ids[j+1] from position j is trained; shifted within each "
    "packed sequence, the last position of every sequence is 0; padding is 0"
)


def shift_within_sequences(mask, seq_starts, length: int | None = None, out=None) -> np.ndarray:
    """uint8 loss mask: out[j] = mask[j+1] inside each sequence, 0 at each sequence's last position.

    `seq_starts` are the start positions (first 0); the last sequence ends at `length` (default
    len(mask)). Positions at or after `length` are 0.
    """
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
