"""`--on-overflow split`: a conversation longer than the pack size becomes several packed sequences, cut
between whole turns, each repeating the conversation's system prompt.

A turn starts at a role sentinel (`sys`, `usr`, `asst`) and runs to the next. A leading system turn is the
prefix every piece repeats (unless it leaves no room); the rest is dealt greedily into pieces of at most
`pack_size - len(prefix)` tokens, cut only before a user turn, so no piece opens with an answer whose question
is elsewhere. An exchange too long for a piece is cut to the room left, as `truncate` cuts, and what it loses
is counted. Pure functions of the tokens and the pack size.
"""

from __future__ import annotations

import numpy as np

from niels_gpt.errors import ConfigError


def role_ids(special: dict, where) -> tuple[int | None, int, tuple[int, ...]]:
    """(system id or None, user id, every role id) from a cache's special_token_ids; refused without sentinels."""
    if special.get("asst") is None or special.get("usr") is None:
        raise ConfigError(f"{where}: --on-overflow split cuts conversations between turns, and this cache records "
                          "no role sentinel ids (its chat template's rendering has none): pass --on-overflow "
                          "truncate or reject")
    roles = tuple(int(special[k]) for k in ("sys", "usr", "asst") if special.get(k) is not None)
    return (None if special.get("sys") is None else int(special["sys"])), int(special["usr"]), roles


def split_example(tokens: np.ndarray, pack_size: int, sys_id: int | None, usr_id: int,
                  roles: tuple[int, ...]) -> tuple[int, list[tuple[int, int]], list[tuple[int, int]]]:
    """Cut one conversation into pieces of at most `pack_size` tokens: (prefix length, body ranges, lost ranges).
    Every piece is tokens[:prefix] + tokens[a:b] for one body range (a, b)."""
    n = len(tokens)
    starts = np.flatnonzero(np.isin(tokens, roles))
    if n and (not starts.size or starts[0] != 0):
        starts = np.concatenate([[0], starts])
    prefix = 0
    if sys_id is not None and n and tokens[0] == sys_id:
        prefix = int(starts[1]) if len(starts) > 1 else n
    if prefix >= pack_size:  # a system prompt that leaves no room: not repeated, cut as a turn
        prefix = 0
    user = [int(s) for s in starts if tokens[s] == usr_id and prefix < s < n]  # the cut points
    kept: list[tuple[int, int]] = []
    lost: list[tuple[int, int]] = []
    room, cur = pack_size - prefix, prefix
    for u0, u1 in zip([prefix, *user], [*user, n], strict=True):  # one exchange at a time
        if u1 - cur <= room:
            continue  # the exchange joins the current piece
        if u0 > cur:
            kept.append((cur, u0))
            cur = u0
        if u1 - u0 <= room:
            continue  # the exchange opens the next piece
        kept.append((u0, u0 + room))  # too long for any piece: cut, its tail lost
        lost.append((u0 + room, u1))
        cur = u1
    if cur < n:
        kept.append((cur, n))
    return prefix, kept, lost
