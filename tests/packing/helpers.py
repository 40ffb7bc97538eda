"""Builders shared by the packing tests: hand-written chat token lists and reference packers."""

from __future__ import annotations

import numpy as np
import torch

from ..conftest import SPECIALS

SYS, USR, ASST, EOT = SPECIALS["sys"], SPECIALS["usr"], SPECIALS["asst"], SPECIALS["eot"]


def chat(i: int, user_len: int, answer_len: int) -> list[int]:
    """A rendered two-turn conversation whose content ids encode (example i, position)."""
    user = [100 + (i * 7 + k) % 900 for k in range(user_len)]
    answer = [1000 + (i * 13 + k) % 900 for k in range(answer_len)]
    return [USR, *user, EOT, ASST, *answer, EOT]


def chats(n: int, seed: int = 0, max_user: int = 30, max_answer: int = 60) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    u = torch.randint(1, max_user, (n,), generator=g).tolist()
    a = torch.randint(1, max_answer, (n,), generator=g).tolist()
    return [chat(i, u[i], a[i]) for i in range(n)]


def naive_pack(lengths, pack_size: int, algorithm: str, seed: int = 0) -> list[list[int]]:
    """O(n * bins) textbook packers: the reference the fast ones must match exactly."""
    lengths = np.asarray(lengths)
    if algorithm == "first_fit_shuffle":
        order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed)).tolist()
    else:
        order = np.argsort(-lengths, kind="stable").tolist()
    room: list[int] = []
    bins: list[list[int]] = []
    for i in order:
        s = int(lengths[i])
        fits = [b for b, r in enumerate(room) if r >= s]
        if algorithm == "bfd":
            b = min(fits, key=lambda b: (room[b], b)) if fits else None
        else:
            b = fits[0] if fits else None
        if b is None:
            room.append(pack_size)
            bins.append([])
            b = len(room) - 1
        room[b] -= s
        bins[b].append(i)
    return bins


def plan_roll(mask_in_bin: np.ndarray, packed_len: int) -> np.ndarray:
    """The design document's materialisation: one roll right over the whole bin."""
    out = np.asarray(mask_in_bin, dtype=np.uint8).copy()
    if packed_len > 0:
        out[1:packed_len] = out[:packed_len - 1].copy()
        out[0] = 0
    return out
