"""The assistant-span rule: which tokens of a rendered conversation are trained. It lives here once.

A token is trained when the last assistant sentinel strictly before it comes after the last EOT strictly
before it, within its sequence: the assistant's content and the EOT that closes it. A sequence start
resets the state, so a sequence cut inside an assistant turn never opens a span in the next one.

    ids    [usr] h  i [eot] [asst] y  o [eot] | [usr] ...
    mask     0   0  0   0     0    1  1   1   |   0

`Tokenizer.render_chat` (the builder), the SFT dataset, packing and stats all apply this function; a
tokenizer with a chat template and no sentinels stores its mask instead (tokenizer/chat.py).
"""

from __future__ import annotations

import numpy as np


def assistant_token_mask(tokens, asst_id: int, eot_id: int, seq_starts=None) -> np.ndarray:
    """bool[len(tokens)]: True on assistant content tokens and their closing EOT; `seq_starts` (first 0)
    resets the state at each sequence start (None: one sequence)."""
    flat = np.asarray(tokens).reshape(-1)
    starts = np.zeros(1, dtype=np.int64) if seq_starts is None else np.asarray(seq_starts, dtype=np.int64)
    starts = starts[(starts > 0) & (starts < flat.size)]
    return _spans(flat, asst_id, eot_id, np.concatenate([np.zeros(1, dtype=np.int64), starts]))


def assistant_span_mask(seqs, asst_id: int, eot_id: int) -> np.ndarray:
    """Bool mask of the shape of `seqs` (..., L): the rule applied to each row of length L on its own."""
    seqs = np.asarray(seqs)
    if seqs.size == 0 or seqs.ndim == 0:
        return np.zeros(seqs.shape, dtype=bool)
    return _spans(seqs.reshape(-1), asst_id, eot_id, np.arange(0, seqs.size, seqs.shape[-1])).reshape(seqs.shape)


def _spans(flat: np.ndarray, asst_id: int, eot_id: int, starts: np.ndarray) -> np.ndarray:
    """The rule over `flat` with the state reset at `starts` (sorted, valid, starts[0] == 0)."""
    # Run by run: a sentinel at p sets the state from p+1 (1 after [asst], 0 after EOT), a sequence start
    # resets it; sort the change points (a reset after an event at the same place), repeat each state.
    # NOTE: 16x1024 rows: 148 us with two running maxima, ~22 us like this (bench_cache_readers.py).
    events = np.flatnonzero((flat == asst_id) | (flat == eot_id))
    where = np.concatenate([events + 1, starts])
    state = np.concatenate([flat[events] == asst_id, np.zeros(len(starts), dtype=bool)])
    order = np.argsort(2 * where + np.repeat([0, 1], [len(events), len(starts)]), kind="stable")
    where, state = where[order], state[order]
    return np.repeat(state, np.diff(where, append=flat.size))
