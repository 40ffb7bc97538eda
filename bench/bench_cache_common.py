"""Shared helpers for the bench_cache_* scripts: synthetic caches in the real layout, timers, tables.

Synthetic pretraining shards are written with the builder's own shard writer (`niels_gpt.formats.writers.ShardWriter`: temporary
names, sha256 while writing, rename) and a meta.json carrying the contract's fields, so the readers
open them exactly as they open a built cache. Token values are random ids below a 16k vocabulary
(torch RNG); the readers do not care what the ids mean.
"""

from __future__ import annotations

import gc
import os
import re
import time
from pathlib import Path

import numpy as np
import torch

from niels_gpt.cache.meta import FORMAT_VERSION, file_record, write_meta
from niels_gpt.formats.writers import SHARD_PATTERN, ShardWriter

SPECIALS = {"sys": 16000, "usr": 16001, "asst": 16002, "eot": 16003}
VOCAB = 16004
BLOCK_TOKENS = 1 << 24  # synthetic tokens generated per write (32 MiB of uint16)


def _meta(kind: str, extra: dict) -> dict:
    meta = {"kind": kind, "format_version": FORMAT_VERSION, "built": True, "dataset_name": "synthetic",
            "dataset_config": None, "split_rule": "synthetic (bench)", "seed": 0, "token_dtype": "uint16-le",
            "tokenizer_sha256": "0" * 64, "vocab_size": VOCAB, "special_token_ids": dict(SPECIALS),
            "streaming": False}
    meta.update(extra)
    return meta


def write_synthetic_pretrain_cache(out: Path, n_tokens: int, *, shard_bytes: int = 128 << 20,
                                   seed: int = 0, val_tokens: int = 0) -> Path:
    """A pretraining cache at `out` with `n_tokens` random uint16 ids in train (and `val_tokens` in val)."""
    dtype = np.dtype("<u2")
    gen = torch.Generator().manual_seed(seed)
    base = torch.randint(VOCAB - 4, (BLOCK_TOKENS,), generator=gen, dtype=torch.int32).numpy().astype(dtype)
    files, totals = {}, {}
    for split, n in (("train", n_tokens), ("val", val_tokens)):
        (out / split).mkdir(parents=True, exist_ok=True)
        for old in (out / split).glob("shard_*.bin"):
            old.unlink()
        w = ShardWriter(out / split, dtype, shard_bytes)
        done, i = 0, 0
        while done < n:
            k = min(BLOCK_TOKENS, n - done)
            # a different block each time without a new RNG draw: rotate the base block
            w.write(np.roll(base, i * 7919)[:k])
            done += k
            i += 1
        for name, rec in w.close().items():
            files[f"{split}/{name}"] = rec
        totals[f"{split}_tokens"] = n
    write_meta(str(out), _meta("pretrain", {"totals": totals, "files": files, "shard_bytes": shard_bytes,
                                            "shard_pattern": SHARD_PATTERN}))
    return out


def write_synthetic_sft_cache(out: Path, n_examples: int, *, seed: int = 0, mean_len: int = 600) -> Path:
    """An SFT cache of `n_examples` chats: [usr] prompt [eot] [asst] answer [eot] (sometimes two rounds).

    Lengths are uniform in [mean_len/4, 7*mean_len/4], so a T=1024 batch holds both truncated and
    padded rows.
    """
    gen = torch.Generator().manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    lengths = torch.randint(mean_len // 4, 7 * mean_len // 4, (n_examples,), generator=gen).numpy()
    total = int(lengths.sum())
    tokens = torch.randint(16000, (total,), generator=gen, dtype=torch.int32).numpy().astype("<u2")
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype("<i8")
    # sentinels: [usr] at 0, [eot] [asst] a third of the way in, [eot] at the end; a second round
    # ([usr] ... [eot] [asst]) in every other example
    third = offsets + lengths // 3
    tokens[offsets] = SPECIALS["usr"]
    tokens[third] = SPECIALS["eot"]
    tokens[third + 1] = SPECIALS["asst"]
    tokens[offsets + lengths - 1] = SPECIALS["eot"]
    two = np.flatnonzero(np.arange(n_examples) % 2 == 0)
    mid = offsets[two] + 2 * lengths[two] // 3
    tokens[mid - 1] = SPECIALS["eot"]
    tokens[mid] = SPECIALS["usr"]
    tokens[mid + 20] = SPECIALS["eot"]
    tokens[mid + 21] = SPECIALS["asst"]
    files = {}
    tokens.tofile(out / "train_tokens.bin")
    np.save(out / "train_idx.npy", offsets)
    np.zeros(0, "<u2").tofile(out / "val_tokens.bin")
    np.save(out / "val_idx.npy", np.zeros(0, "<i8"))
    files["train_tokens.bin"] = file_record(out / "train_tokens.bin", total)
    files["val_tokens.bin"] = file_record(out / "val_tokens.bin", 0)
    files["train_idx.npy"] = {**file_record(out / "train_idx.npy", None), "examples": n_examples}
    files["val_idx.npy"] = {**file_record(out / "val_idx.npy", None), "examples": 0}
    write_meta(str(out), _meta("sft", {"files": files, "totals": {
        "train_examples": n_examples, "val_examples": 0, "train_tokens": total, "val_tokens": 0}}))
    return out


def timed(fn, *, repeat: int = 2) -> float:
    """Seconds of the fastest of `repeat` calls of fn()."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def best_rate(fn, *, n: int, repeat: int = 3) -> float:
    """Calls per second of fn(): the best of `repeat` timed runs of `n` calls (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t0)
    return n / best


def proc_status(*fields: str) -> dict[str, int]:
    """Fields of /proc/self/status in kB (e.g. RssAnon, RssFile, VmHWM)."""
    text = Path("/proc/self/status").read_text()
    return {f: int(re.search(rf"^{f}:\s+(\d+) kB", text, re.M).group(1)) for f in fields}


def proc_read_bytes() -> int:
    """Bytes this process caused to be read from storage (/proc/self/io read_bytes)."""
    m = re.search(r"^read_bytes:\s+(\d+)", Path("/proc/self/io").read_text(), re.M)
    return int(m.group(1))


def evict(paths) -> str:
    """Drop `paths` from the page cache: drop_caches when root allows it, else POSIX_FADV_DONTNEED."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise(DONTNEED)"


def table(title: str, header: list[str], rows: list[list]) -> str:
    """A plain-text table; floats get 3 significant figures."""
    def cell(v):
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return str(v)
    cells = [[cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
              for r in cells]
    return "\n".join(lines)
