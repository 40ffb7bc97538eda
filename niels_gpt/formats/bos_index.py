"""The `.bos.idx` sidecar of a nanoGPT shard: where every BOS token is. Reader and writer.

Byte layout (no header):

    offset  type       field
    0       int32 LE   positions[file_size / 4]: token index (0 = first payload token) of each BOS,
                       strictly increasing

`<dir>/<stem>.bin` has its sidecar at `<dir>/<stem>.bos.idx`. NeMo AutoModel's reader expects token indices,
but its public writer stores header-inclusive byte offsets (1024 + index * itemsize), silently misaligning
`align_to_bos`. We write token indices; on reading, positions that do not all land on BOS tokens are tried
as byte offsets (with and without the header), else the shard is rescanned; both fallbacks warn.

Cost: the check is one gather of len(positions) tokens; the scan is one pass over the shard.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

from niels_gpt.atomic import write_bytes_atomic
from niels_gpt.errors import FormatError

SUFFIX = ".bos.idx"
_HEADER_BYTES = 1024


def sidecar_path(bin_path: str | os.PathLike) -> Path:
    p = Path(bin_path)
    return p.with_name(p.stem + SUFFIX)


def write_bos_index(bin_path: str | os.PathLike, positions: np.ndarray) -> str:
    """Write token indices (increasing; a nanoGPT shard's fit int32) as int32 LE next to `bin_path`, atomically.
    Returns the sidecar path."""
    out = sidecar_path(bin_path)
    write_bytes_atomic(out, np.asarray(positions).astype("<i4").tobytes())
    return str(out)


def read_sidecar(path: str | os.PathLike) -> np.ndarray:
    size = os.path.getsize(path)
    if size % 4:
        raise FormatError(f"{path}: {size} bytes is not a whole number of int32 positions; "
                          "the sidecar is truncated: delete it (the shard is rescanned)")
    return np.fromfile(path, dtype="<i4").astype(np.int64)


def scan_bos(tokens: np.ndarray, bos_id: int) -> np.ndarray:
    return np.flatnonzero(np.asarray(tokens) == bos_id).astype(np.int64)


def _lands_on_bos(pos: np.ndarray, tokens: np.ndarray, bos_id: int) -> bool:
    if pos.size == 0:
        return True
    if pos.min() < 0 or pos.max() >= len(tokens) or np.any(np.diff(pos) <= 0):
        return False
    return bool(np.all(np.asarray(tokens[pos]) == bos_id))


def load_bos_index(bin_path: str | os.PathLike, tokens: np.ndarray, bos_id: int | None, *,
                   known_bos: tuple[int, str] | None = None) -> tuple[np.ndarray, int] | None:
    """(token indices of BOS, bos_id) from the sidecar of `bin_path`, or None without one.

    `bos_id=None` takes the id at the first listed position; positions that do not all hold it raise, naming
    the id to rescan with only when `known_bos` ((id, its source): the tokenizer) gives it, never a guess from
    the tokens (a shard quoting its BOS inside documents fools any guess).
    """
    side = sidecar_path(bin_path)
    if not side.is_file():
        return None
    raw = read_sidecar(side)
    itemsize = tokens.dtype.itemsize
    if bos_id is None:
        if raw.size == 0:
            return None
        candidates = [raw, (raw - _HEADER_BYTES) // itemsize, raw // itemsize]
        for cand in candidates:
            if cand.size and 0 <= cand[0] < len(tokens):
                bos_id = int(tokens[cand[0]])
                if _lands_on_bos(cand, tokens, bos_id):
                    break
        else:
            raise FormatError(_no_common_token(side, raw, tokens, known_bos))
    if _lands_on_bos(raw, tokens, bos_id):
        return raw, bos_id
    for offset, label in ((_HEADER_BYTES, "header-inclusive"), (0, "header-exclusive")):
        shifted = raw - offset
        if np.all(shifted % itemsize == 0):
            cand = shifted // itemsize
            if _lands_on_bos(cand, tokens, bos_id):
                warnings.warn(f"{side}: positions are {label} byte offsets, not token indices (a known "
                              "writer bug); converted them. Rewrite the sidecar with `convert --bos-index`",
                              stacklevel=2)
                return cand, bos_id
    warnings.warn(f"{side}: positions do not land on BOS token {bos_id}; ignoring the sidecar and "
                  "scanning the shard instead. Rewrite it with `convert --bos-index`", stacklevel=2)
    return scan_bos(tokens, bos_id), bos_id


def _no_common_token(side: Path, raw: np.ndarray, tokens: np.ndarray, known_bos: tuple[int, str] | None) -> str:
    """Why a sidecar names no BOS id: what its positions hold, and how to rescan the shard."""
    if known_bos is not None:
        rescan = (f"pass the BOS id of {known_bos[1]}, {known_bos[0]} (--bos-id {known_bos[0]} for convert and "
                  f"prepare-data, bos_id={known_bos[0]} in Python)")
    else:
        rescan = ("pass the BOS id of the tokenizer that made the shard (--bos-id ID for convert and prepare-data, "
                  "bos_id=ID in Python; prepare-data --tokenizer PATH names it)")
    rescan += " to check the sidecar against it and rescan the shard, or delete the sidecar"
    inside = raw[(raw >= 0) & (raw < len(tokens))]
    if inside.size == 0:
        return (f"{side}: none of its {raw.size} positions lies inside the shard ({len(tokens)} tokens): the sidecar "
                f"belongs to another file; {rescan}")
    held = np.asarray(tokens[inside]).astype(np.int64)
    values, counts = np.unique(held, return_counts=True)
    best = int(values[np.argmax(counts)])
    odd = int(np.flatnonzero(held != best)[0]) if np.any(held != best) else None
    where = (f"position {int(inside[odd])} holds token {int(held[odd])}" if odd is not None
             else f"{raw.size - inside.size} position(s) lie beyond the shard's end")
    return (f"{side}: the sidecar disagrees with the shard: its {raw.size} positions do not all hold one token "
            f"({int(counts.max())} hold token {best}, {where}), so it does not say which id is the BOS; {rescan}")
