"""Trained-token masks for packed SFT, and the shift that aligns them with next-token prediction.

The SFT cache stores no mask. A token is a trained target iff it lies in an assistant span: after an
assistant sentinel, up to and including the next EOT (the rule `Tokenizer.render_chat` and the SFT
dataset apply). `assistant_token_mask` computes that rule for a whole packed bin in a few numpy passes,
with the span state reset at every sequence start, so a sequence cut inside an assistant turn never
opens a span in the sequence after it.

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


def assistant_token_mask(tokens, asst_id: int, eot_id: int, seq_starts=None) -> np.ndarray:
    """bool[len(tokens)]: True on assistant content tokens and the EOT that closes them.

    `seq_starts` (sorted start positions, first 0) resets the span state at each sequence start;
    None means one sequence.
    """
    tokens = np.asarray(tokens)
    n = len(tokens)
    pos = np.arange(n, dtype=np.int64)
    # last_open[i]: position of the last assistant sentinel strictly before i (-1 if none).
    opened = np.where(tokens == asst_id, pos, -1)
    last_open = np.empty(n, dtype=np.int64)
    if n:
        last_open[0] = -1
        np.maximum.accumulate(opened[:-1], out=last_open[1:])
    # last_close[i]: last EOT strictly before i, or start-1 of i's sequence, whichever is later.
    closed = np.where(tokens == eot_id, pos, -1)
    if seq_starts is not None:
        starts = np.asarray(seq_starts, dtype=np.int64)
        starts = starts[(starts > 0) & (starts < n)]
        # A reset at start s acts like an EOT at s-1 that is seen from s on.
        closed[starts - 1] = np.maximum(closed[starts - 1], starts - 1)
    last_close = np.empty(n, dtype=np.int64)
    if n:
        last_close[0] = -1
        np.maximum.accumulate(closed[:-1], out=last_close[1:])
    return last_open > last_close


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
