"""What a pack size cuts: the share of an SFT split's tokens and trained targets that truncation drops, and
the pack size that would keep 99% of them.

- tokens lost: sum of max(0, length - pack_size) over the examples, out of every token of the split.
- trained targets lost: trained tokens (stored mask, else the span rule) at positions >= pack_size of their
  example, out of every trained token.
- the pack size keeping `KEEP` of both, rounded up to a multiple of `ROUND_TO`; above `WARN_SHARE` lost,
  `pack-sft` warns and names it.

Cost: nothing when no example is too long; else one chunked pass over the split's tokens.
"""

from __future__ import annotations

import numpy as np

from niels_gpt.packing.source import SFTSplit
from niels_gpt.spans import assistant_token_mask

KEEP = 0.99
WARN_SHARE = 0.01
ROUND_TO = 64
CHUNK_EXAMPLES = 1 << 14


def truncation_figures(split: SFTSplit, pack_size: int) -> dict:
    """{tokens, tokens_lost, trained_targets, trained_targets_lost, pack_size_keeping_99pct} of `split`."""
    lengths = split.lengths.astype(np.int64)
    tokens = int(lengths.sum())
    out = {"tokens": tokens, "tokens_lost": int(np.maximum(lengths - pack_size, 0).sum()),
           "trained_targets": None, "trained_targets_lost": 0, "pack_size_keeping_99pct": pack_size}
    if out["tokens_lost"] == 0:
        return out
    # the position within its example of every trained token, gathered chunk by chunk
    positions = []
    for lo in range(0, len(lengths), CHUNK_EXAMPLES):
        hi = min(lo + CHUNK_EXAMPLES, len(lengths))
        a, b = int(split.starts[lo]), int(split.starts[hi - 1] + lengths[hi - 1])
        starts = split.starts[lo:hi] - a
        mask = (np.asarray(split.mask[a:b]).astype(bool) if split.mask is not None
                else assistant_token_mask(np.asarray(split.tokens[a:b]), split.asst_id, split.eot_id, starts))
        where = np.flatnonzero(mask)
        owner = np.searchsorted(starts, where, side="right") - 1
        positions.append(where - starts[owner])
    pos = np.concatenate(positions)  # one chunk at least: tokens are lost, so there are examples
    pos = pos[pos > 0]
    out["trained_targets"] = int(len(pos))
    out["trained_targets_lost"] = int(np.count_nonzero(pos >= pack_size))
    out["pack_size_keeping_99pct"] = _keeping(lengths, pos)
    return out


def _keeping(lengths: np.ndarray, trained_pos: np.ndarray) -> int:
    """The smallest L (a multiple of ROUND_TO) keeping KEEP of the tokens and of the trained targets."""
    lo, hi = 1, int(lengths.max())
    while lo < hi:  # kept tokens and kept targets both grow with L: bisect
        mid = (lo + hi) // 2
        kept_tokens = np.minimum(lengths, mid).sum() >= KEEP * lengths.sum()
        kept_targets = np.count_nonzero(trained_pos < mid) >= KEEP * len(trained_pos)
        lo, hi = (lo, mid) if kept_tokens and kept_targets else (mid + 1, hi)
    return -(-lo // ROUND_TO) * ROUND_TO


def truncation_warning(figures: dict, pack_size: int, where: str) -> str | None:
    """The warning `pack-sft` prints when truncation drops more than WARN_SHARE, else None."""
    tokens_share = figures["tokens_lost"] / figures["tokens"] if figures["tokens"] else 0.0
    trained = figures["trained_targets"]
    trained_share = figures["trained_targets_lost"] / trained if trained else 0.0
    if max(tokens_share, trained_share) <= WARN_SHARE:
        return None
    cut = "splits examples and loses" if "split_examples" in figures else "truncates examples and drops"
    return (f"{where}: --seq-len {pack_size} {cut} {tokens_share:.1%} of the tokens "
            f"({figures['tokens_lost']:,} of {figures['tokens']:,}) and {trained_share:.1%} of the trained targets "
            f"({figures['trained_targets_lost']:,} of {trained or 0:,}); --seq-len "
            f"{figures['pack_size_keeping_99pct']} keeps {KEEP:.0%} of both (or --on-overflow reject to refuse "
            "long examples)")
