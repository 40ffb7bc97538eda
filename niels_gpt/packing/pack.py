"""SFT cache -> packed bins on disk (memmap_padded_v1): plan the bins, then stream them out.

1. open one split of the SFT cache; examples longer than pack_size are truncated, rejected, or split between
   whole turns (`on_overflow`, split_example); what truncation loses is measured (truncation.py);
2. assign examples to bins (`pack_lengths`: ffd, bfd or first_fit_shuffle);
3. per bin, copy the tokens into one int32 scratch buffer, derive the trained mask (reset at each sequence
   start), shift it within each sequence, and hand both to the writer.

Memory beyond the plan (O(n) int64) is O(pack_size). Packing `train` also packs the val split into `out/val/`;
the train manifest is written last. A local `out` is built aside and swapped in whole (niels_gpt/staging.py);
a URL is written locally and uploaded.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from niels_gpt.atomic import write_bytes_atomic
from niels_gpt.constants import EXAMPLES_NAME
from niels_gpt.errors import ConfigError
from niels_gpt.meta import file_record
from niels_gpt.output_guard import check_output
from niels_gpt.packing.algorithms import (
    DEFAULT_ALGORITHM,
    DEFAULT_PACK_SIZE,
    DEFAULT_SEED,
    BinAssignment,
    pack_lengths,
)
from niels_gpt.packing.memmap_format import MemmapShardWriter, shift_within_sequences
from niels_gpt.packing.source import SFTSplit, open_sft_split
from niels_gpt.packing.truncation import truncation_figures, truncation_warning
from niels_gpt.seeds import check_seed
from niels_gpt.spans import assistant_token_mask
from niels_gpt.staging import build_aside
from niels_gpt.storage.upload import local_path_of, staged_output

ON_OVERFLOW = ("truncate", "reject", "split")
DEFAULT_ON_OVERFLOW = "truncate"
INT32_MAX = np.iinfo(np.int32).max
VAL_DIR = "val"  # the packed val split: a shard of its own inside the train shard's directory


@dataclass
class PackPlan:
    split: SFTSplit
    assignment: BinAssignment
    example_ids: np.ndarray  # int64[m]: cache example id of each packed sequence (empty ones dropped)
    truncated: int
    skipped_empty: int
    truncation: dict  # what the pack size cuts (niels_gpt/packing/truncation.py)
    # int64[m, 4]: each packed sequence is tokens[p:p+pn] + tokens[a:a+n] for its row (p, pn, a, n): a prefix
    # (the system prompt a split conversation repeats; pn = 0 otherwise) and a body
    segments: np.ndarray


def plan_packing(split: SFTSplit, *, pack_size: int = DEFAULT_PACK_SIZE, algorithm: str = DEFAULT_ALGORITHM,
                 on_overflow: str = DEFAULT_ON_OVERFLOW, seed: int = DEFAULT_SEED) -> PackPlan:
    """Decide the bins: clip, split or reject long examples, drop empty ones, run the packing algorithm."""
    if on_overflow not in ON_OVERFLOW:
        raise ConfigError(f"on_overflow must be one of {', '.join(ON_OVERFLOW)}, got {on_overflow!r}")
    lengths = split.lengths
    over = np.flatnonzero(lengths > pack_size)
    if over.size and on_overflow == "reject":
        i = int(over[0])
        raise ConfigError(
            f"{split.cache_dir}/{split.split}_tokens.bin: example {i} has {int(lengths[i])} tokens, more than "
            f"pack_size={pack_size} ({over.size} such examples); raise --seq-len or pass --on-overflow truncate "
            "or split"
        )
    keep = np.flatnonzero(lengths > 0)
    clipped = np.minimum(lengths[keep], pack_size)
    starts = split.starts[keep]
    segments = np.stack([starts, np.zeros_like(starts), starts, clipped], axis=1).astype(np.int64)
    figures = truncation_figures(split, pack_size)
    truncated = int(over.size)
    if on_overflow == "split":
        keep, segments, truncated, figures = _split_long(split, pack_size, keep, segments, figures)
    assignment = pack_lengths(segments[:, 1] + segments[:, 3], pack_size, algorithm, seed=seed)
    return PackPlan(split, assignment, keep, truncated, int(len(lengths) - np.count_nonzero(lengths > 0)),
                    figures, segments)


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
    Every piece is tokens[:prefix] + tokens[a:b] for one body range (a, b).

    A turn starts at a role sentinel (`sys`, `usr`, `asst`) and runs to the next. A leading system turn is the
    prefix every piece repeats (unless it leaves no room); the rest is dealt greedily into pieces of at most
    `pack_size - len(prefix)` tokens, cut only before a user turn, so no piece opens with an answer whose
    question is elsewhere. An exchange too long for a piece is cut to the room left, as `truncate` cuts, and
    what it loses is counted. A pure function of the tokens and the pack size."""
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


def _split_long(split: SFTSplit, pack_size: int, keep: np.ndarray, segments: np.ndarray, figures: dict):
    """Replace the rows of examples longer than pack_size by their pieces (split_example)."""
    sys_id, usr_id, roles = role_ids(split.meta["special_token_ids"], f"{split.cache_dir}/meta.json")
    ids, rows, cut, lost_tokens, lost_targets, repeated, pieces = [], [], 0, 0, 0, 0, 0
    for k, ex in enumerate(keep.tolist()):
        a, n = int(split.starts[ex]), int(split.lengths[ex])
        if n <= pack_size:
            ids.append(ex)
            rows.append(segments[k])
            continue
        tokens = np.asarray(split.tokens[a:a + n])
        prefix, kept, lost = split_example(tokens, pack_size, sys_id, usr_id, roles)
        untrained = [(s, e) for s, e in kept if not np.any(tokens[s:e] == split.asst_id)]
        kept = [r for r in kept if r not in untrained]  # a piece with no assistant turn trains nothing: dropped
        lost = sorted(lost + untrained)
        for s, e in kept:
            if s == prefix:
                s = 0  # the first piece runs on from the system prompt: one body
            pre = prefix if s else 0
            ids.append(ex)
            rows.append(np.array([a, pre, a + s, e - s], dtype=np.int64))
            repeated += pre
        pieces += len(kept)
        if lost:
            cut += 1
            trained = (np.asarray(split.mask[a:a + n]).astype(bool) if split.mask is not None
                       else assistant_token_mask(tokens, split.asst_id, split.eot_id))
            for s, e in lost:
                lost_tokens += e - s
                lost_targets += int(np.count_nonzero(trained[s:e]))
    figures = {**figures, "tokens_lost": lost_tokens, "trained_targets_lost": lost_targets,
               "split_examples": int(np.count_nonzero(split.lengths > pack_size)), "split_pieces": pieces,
               "prompt_tokens_repeated": repeated}
    return np.asarray(ids, dtype=np.int64), np.array(rows, dtype=np.int64).reshape(-1, 4), cut, figures


def materialize_bin(split: SFTSplit, segments: np.ndarray, scratch_ids: np.ndarray, scratch_mask: np.ndarray,
                    scratch_starts: np.ndarray) -> tuple[int, int]:
    """Fill the scratch buffers with one bin (rows of PackPlan.segments); return (packed_len, sequences)."""
    pos = 0
    tokens = split.tokens
    total = int(segments[:, 1].sum() + segments[:, 3].sum())
    stored = None if split.mask is None else np.zeros(total, dtype=bool)
    for k, (p, pn, a, n) in enumerate(segments.tolist()):
        scratch_starts[k] = pos
        for start, count in ((p, pn), (a, n)):
            if not count:
                continue
            scratch_ids[pos:pos + count] = tokens[start:start + count]
            if stored is not None:  # a template-rendered cache: its stored mask, cut like its tokens
                stored[pos:pos + count] = split.mask[start:start + count]
            pos += count
    nseq = len(segments)
    trained = (stored if stored is not None
               else assistant_token_mask(scratch_ids[:pos], split.asst_id, split.eot_id, scratch_starts[:nseq]))
    shift_within_sequences(trained, scratch_starts[:nseq], pos, out=scratch_mask[:pos])
    return pos, nseq


def write_plan(plan: PackPlan, out_dir, *, progress: bool = False, extra: dict | None = None) -> dict:
    """Stream the planned bins into a memmap_padded_v1 shard at local directory `out_dir`."""
    a = plan.assignment
    ps = a.pack_size
    scratch_ids = np.zeros(ps, dtype=np.int32)
    scratch_mask = np.zeros(ps, dtype=np.uint8)
    max_per_bin = int(np.diff(a.bin_offsets).max()) if a.num_bins else 0
    scratch_starts = np.zeros(max(max_per_bin, 1), dtype=np.int64)
    bins = range(a.num_bins)
    if progress:
        from tqdm import tqdm

        bins = tqdm(bins, desc="pack-sft", unit="bin", disable=None)
    with MemmapShardWriter(out_dir, a.num_bins, ps, len(a.items)) as writer:
        for b in bins:
            items = a.bin_items(b)
            n, nseq = materialize_bin(plan.split, plan.segments[items], scratch_ids, scratch_mask, scratch_starts)
            writer.write_bin(scratch_ids[:n], scratch_mask[:n], scratch_starts[:nseq])
        manifest = writer.finalize(
            algorithm=a.algorithm, truncated=plan.truncated, skipped_empty=plan.skipped_empty,
            truncation=plan.truncation, source=plan.split.provenance(), examples=write_examples(plan, out_dir),
            **(extra or {}))
    return manifest


def write_examples(plan: PackPlan, out_dir) -> dict:
    """Write `examples.npy`: the cache example of each packed sequence, in bin order. Returns its record."""
    ids = np.asarray(plan.example_ids, dtype="<i8")[plan.assignment.items]
    buf = io.BytesIO()
    np.save(buf, ids, allow_pickle=False)
    data = buf.getvalue()
    write_bytes_atomic(Path(out_dir) / EXAMPLES_NAME, data)
    return {"name": EXAMPLES_NAME, "dtype": "int64", "shape": [len(ids)], **file_record(None, None, data=data),
            "split": plan.split.split,
            "meaning": "the SFT cache's example index of each packed sequence, in bin order; bin b holds "
                       "sequences seq_offsets[b]..seq_offsets[b+1]"}


def pack_sft(cache_dir, out, *, pack_size: int = DEFAULT_PACK_SIZE, algorithm: str = DEFAULT_ALGORITHM,
             split: str = "train", on_overflow: str = DEFAULT_ON_OVERFLOW, seed: int = DEFAULT_SEED,
             progress: bool = False, warn: bool = True, val: bool = True) -> dict:
    """Pack one split of the SFT cache at `cache_dir` into a memmap_padded_v1 shard at `out` (a path or URL).

    The train split's val examples go to `out/val/` unless `val=False`. Returns the manifest plus `val` (the val
    shard's manifest, or None); `warn=False` leaves the truncation warning to the caller.
    """
    check_seed(seed)
    local = local_path_of(out)
    if local is not None:  # before any work: only packed bins of ours are ever replaced
        check_output(local, kind="packed", flag="OUT", inputs=[cache_dir])
    src = open_sft_split(cache_dir, split)
    if len(src) == 0:
        raise ConfigError(f"{cache_dir}: split {split!r} has no examples; nothing to pack")
    if int(src.meta.get("vocab_size", 0)) > INT32_MAX:
        raise ConfigError(f"{cache_dir}/meta.json: vocab_size {src.meta['vocab_size']} does not fit the int32 "
                          "input_ids of memmap_padded_v1")
    plan = plan_packing(src, pack_size=pack_size, algorithm=algorithm, on_overflow=on_overflow, seed=seed)
    message = truncation_warning(plan.truncation, pack_size, f"{cache_dir} ({split})")
    if warn and message is not None:
        warnings.warn(message, stacklevel=2)
    extra = {"seed": int(seed), "on_overflow": on_overflow}
    val_plan = None
    if split == "train" and val and has_examples(src.meta, "val"):
        val_plan = plan_packing(open_sft_split(cache_dir, "val"), pack_size=pack_size, algorithm=algorithm,
                                on_overflow=on_overflow, seed=seed)

    # a URL is written in a local directory, then uploaded manifest last
    aside = staged_output(out, guard=True) if local is None else build_aside(local, kind="packed", flag="OUT")
    with aside as stage:
        # the val shard first: the train manifest, written last, is the commit marker of the whole output
        held_out = None if val_plan is None else write_plan(val_plan, Path(stage) / VAL_DIR, extra=extra)
        return {**write_plan(plan, Path(stage), progress=progress, extra=extra), "val": held_out}


def has_examples(meta: dict, split: str) -> bool:
    """Whether an SFT cache's meta.json lists a `split` with at least one example."""
    rec = meta.get("files", {}).get(f"{split}_idx.npy")
    return isinstance(rec, dict) and int(rec.get("examples", 1)) > 0
