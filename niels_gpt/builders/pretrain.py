"""The one-process pretraining builder (`build_pretrain_cache`), its meta.json and the admission rule.

- documents pass an optional seeded shuffle buffer, then are encoded in batches (builders/encoding.py);
  the output does not depend on the number of encode workers;
- each document gets one separator (EOT after, or a tokenizer's BOS before); empty documents and skipped
  records are counted by reason where they stand in the stream;
- `Admission` (shared with the parallel commit): the first documents fill val to exactly `max_val_tokens`,
  the rest train to `max_train_tokens` (the crossing document keeps what fits and its cut is recorded), or
  with `val_frac` one torch draw per document; `SplitTexts` for sources with their own split;
- shards of at most `shard_bytes`; reading stops once both budgets are met; meta.json is written last.
Memory: one encode batch plus the shuffle buffer.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import Counter, deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from niels_gpt import allocator
from niels_gpt.builders.common import all_skipped, common_meta, resolve_dtype, start_build
from niels_gpt.builders.encode_pool import EncodePool
from niels_gpt.builders.encoding import ENCODE_BATCH_DOCS, _encode_threads, _encoded_batches, shuffled
from niels_gpt.errors import ConfigError
from niels_gpt.formats.writers import (
    SHARD_PATTERN,
    Budgeted,
    ShardWriter,
    WriterPipeline,
    check_range,
    check_shard_bytes,
)
from niels_gpt.formats.zstd_shard import SUFFIX, compression_meta
from niels_gpt.meta import write_meta
from niels_gpt.progress import BuildProgress
from niels_gpt.seeds import TorchDraws, check_seed
from niels_gpt.sources.origins import OriginLog, origins_meta
from niels_gpt.staging import build_aside
from niels_gpt.storage.upload import writes_to_url
from niels_gpt.tokenizer.base import document_separator
from niels_gpt.tokenizer.fast import encoder_record

MAX_TRAIN_TOKENS = 200_000_000
MAX_VAL_TOKENS = 5_000_000
DRAW_BLOCK = 1024  # val_frac draws: torch.rand(DRAW_BLOCK) at a time (the same values as one at a time)
SPLIT_RULE = ("stream order: the first documents fill val up to max_val_tokens, the rest fill train up to "
              "max_train_tokens; the document crossing a budget keeps {}")


class SplitTexts(NamedTuple):
    """Documents of a source that defines its own train/val split."""

    train: Iterable[str]
    val: Iterable[str]


def val_seed(seed: int) -> int:
    """The seed of the val_frac draws: derived from `seed`, so they are not the shuffle buffer's draws."""
    return int.from_bytes(hashlib.sha256(f"val_frac:{seed}".encode()).digest()[:8], "little") >> 1


def split_rule(seed: int, val_frac: float | None, before: bool) -> str:
    if val_frac is None:
        return SPLIT_RULE.format("its BOS and its first (room - 1) tokens" if before else
                                 "its first (room - 1) tokens and its EOT")
    return (f"by document: g = torch.Generator().manual_seed({val_seed(seed)}) (from seed {seed}: the first 8 "
            f"bytes of sha256('val_frac:{seed}'), little-endian, >> 1); the k-th non-empty document of the stream "
            f"goes to val when the k-th draw of torch.rand({DRAW_BLOCK}, generator=g, dtype=torch.float64) blocks is "
            f"< {val_frac!r}, else to train; a document whose split is full is left out; reading stops when both "
            "splits are full")


def _pieces_rule(chars: int | None) -> str:
    """--val-per-input's part of the split rule: what a "document" of the by-document draw is."""
    if not chars:
        return ""
    return (f"; with val_per_input, each document is first cut into pieces, each a document of the draw: a cut "
            f"just after the first blank line (\"\\n\\n\") at or past {chars} characters from the piece's start, "
            "repeated; a last piece of only whitespace stays with the one before (sources/inputs.py::val_pieces)")


class Admission:
    """Where each document of a single stream goes (val, train, or nowhere) and when the stream is done."""

    def __init__(self, sinks: dict[str, Budgeted], val_frac: float | None, seed: int):
        self.sinks, self.val_frac = sinks, val_frac
        self.order = [sinks["val"], sinks["train"]]
        self.gen = TorchDraws(val_seed(seed)) if val_frac is not None else None  # torch's draws (seeds.py)
        self.draws: list[float] = []

    def admit(self, doc, job: list) -> int | None:
        """Plan `doc` into `job`; the tokens it adds, or None when both splits are full (read no further)."""
        if self.val_frac is None:
            while self.order and self.order[0].full:
                self.order.pop(0)
            return self.order[0].plan(doc, job) if self.order else None
        if self.sinks["val"].full and self.sinks["train"].full:
            return None
        if not self.draws:
            self.draws = self.gen.uniform(DRAW_BLOCK)[::-1]
        sink = self.sinks["val"] if self.draws.pop() < self.val_frac else self.sinks["train"]
        return 0 if sink.full else sink.plan(doc, job)


def check_budgets(max_train_tokens: int, max_val_tokens: int, val_frac: float | None, where) -> None:
    for name, value in (("max_train_tokens", max_train_tokens), ("max_val_tokens", max_val_tokens)):
        if value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")
    if max_train_tokens == 0 and max_val_tokens == 0:
        raise ConfigError(f"{where}: max_train_tokens and max_val_tokens are both 0, so nothing would be built; "
                          "give either a positive budget (--max-tokens / --val-tokens)")
    if val_frac is not None and not 0.0 < val_frac < 1.0:
        raise ConfigError(f"--val-frac must be in (0, 1), got {val_frac}")


@allocator.keeping
@writes_to_url  # out_dir may be an fsspec URL: built locally, uploaded, meta.json last
def build_pretrain_cache(
    texts: Iterable[str] | SplitTexts,
    out_dir: str,
    *,
    tokenizer,
    max_train_tokens: int,
    max_val_tokens: int,
    shard_bytes: int,
    seed: int,
    shuffle_buffer: int | None,
    num_workers: int | None = 1,
    token_dtype: str | None = None,
    dataset_name: str | None = None,
    dataset_config: str | None = None,
    streaming: bool = False,
    source: dict | Callable[[], dict] | None = None,
    progress: bool | None = False,
    input_bytes: int | None = None,
    val_frac: float | None = None,
    tokenizer_path: str | None = None,
    compress: str | None = None,
) -> None:
    """Write out_dir/{train,val}/shard_*.bin and meta.json (last); deterministic given seed and stream order.

    `texts`: one stream (items may be `Skipped(reason)`) or `SplitTexts`. `num_workers` encode workers (None:
    one per core) never change the bytes. `source`: meta.json's record of the input, or a callable called once
    the stream is read (its skip counts are then final; it may refuse the build). `tokenizer_path`: where the
    tokenizer is found again (tokenizer/find.py). `compress="zstd"`: shards as `shard_*.bin.zst`.
    """
    check_budgets(max_train_tokens, max_val_tokens, val_frac, out_dir)
    check_seed(seed)
    check_shard_bytes(shard_bytes)
    final = Path(out_dir)
    dtype = resolve_dtype(tokenizer, token_dtype)
    budget_bytes = (max_train_tokens + max_val_tokens) * dtype.itemsize
    with build_aside(final, needs=budget_bytes if budget_bytes < 1 << 50 else None) as out:
        workers = _encode_threads(num_workers)
        separator, writers, sinks = open_splits(out, tokenizer, dtype, (max_train_tokens, max_val_tokens),
                                                shard_bytes, compress)
        skipped: Counter = Counter()
        own_split = isinstance(texts, SplitTexts)
        # origins: a planned stream's (builders/run.py) documents know their input and record
        log = OriginLog(None) if hasattr(texts.train if own_split else texts, "with_origins") else None
        # first: a pool of forked processes (a tokenizer that asks for them) starts before any thread here
        pool = EncodePool(tokenizer, workers) if workers > 1 else None
        bar = BuildProgress(f"pretrain {dataset_name or final.name}", progress=progress, input_bytes=input_bytes)
        exhausted = True
        failed = False
        pipe = WriterPipeline()
        fifo: deque = deque()

        def fill(stream, seed: int, admit) -> bool:
            """Admit the encoded documents of `stream` until `admit` says the splits are full; True if the
            stream ended first. A batch is read only after a document of the previous one found no room, so
            the stream is read, and the shuffle's RNG drawn, as far as a document-at-a-time loop would."""
            gen = TorchDraws(seed) if shuffle_buffer and shuffle_buffer > 1 else None  # the buffer's (seeds.py)
            if log is not None:  # (item, origin) pairs: shuffled as pairs, origins queued in stream order
                docs = bar.documents(_unpaired(shuffled(stream.with_origins(), shuffle_buffer, gen), fifo))
            else:
                docs = shuffled(bar.documents(stream), shuffle_buffer, gen)
            for batch in _encoded_batches(docs, tokenizer, pool, workers, skipped):
                job: list = []
                stop = False
                for ids in batch:
                    added = admit(ids, job)
                    if added is None:
                        stop = True
                        break
                    if log is not None:
                        log.note({"val": sinks["val"].documents, "train": sinks["train"].documents},
                                 fifo.popleft())
                    bar.add_tokens(added)
                pipe.submit(job)
                if stop:
                    return False
            return True

        try:
            if own_split:
                for split in ("val", "train"):  # one generator per split: val never shifts train's draws
                    sink = sinks[split]
                    fill(getattr(texts, split), seed + (split == "train"),
                         lambda ids, job, sink=sink: None if sink.full else sink.plan(ids, job))
            else:
                exhausted = False  # an error leaves the bar unfinished
                exhausted = fill(texts, seed, Admission(sinks, val_frac, seed).admit)
            pipe.close()
            records = {f"{s}/{name}": rec for s in ("train", "val") for name, rec in writers[s].close().items()}
            if log is not None:
                log.table = (texts.train.origin_table() + texts.val.origin_table()) if own_split else texts.origin_table()
                records.update(log.write(out, {s: sinks[s].documents for s in ("train", "val")}))
        except BaseException:
            failed = True
            with contextlib.suppress(BaseException):
                pipe.close()
            for w in writers.values():
                w.abort()
            raise
        finally:
            if pool is not None:  # after an error, wait until no worker is still encoding
                pool.shutdown(wait=failed)
            bar.close(finished=exhausted)
        meta = pretrain_meta(tokenizer, dtype, final, writers=writers, sinks=sinks, records=records,
                             separator=separator, seed=seed, dataset_name=dataset_name,
                             dataset_config=dataset_config, streaming=streaming, source=source,
                             own_split=own_split, exhausted=exhausted, skipped=skipped,
                             shard_bytes=shard_bytes, shuffle_buffer=shuffle_buffer, val_frac=val_frac,
                             tokenizer_path=tokenizer_path, origins=log is not None)
        write_meta(str(out), meta)


def _unpaired(pairs, fifo: deque):
    """The items of (item, origin) pairs; the origin of each document the builder encodes (a non-empty
    str: encoding._read_batches's test) queued in `fifo`, in order."""
    for item, origin in pairs:
        if isinstance(item, str) and item and not item.isspace():
            fifo.append(origin)
        yield item


def open_splits(out: Path, tokenizer, dtype: np.dtype, budgets: tuple[int, int], shard_bytes: int,
                compress: str | None):
    """(separator, writers, sinks) of the train and val splits of a pretraining cache written at `out`."""
    separator = document_separator(tokenizer)  # our EOT, or a user tokenizer's EOS after (or BOS before) each
    check_range(np.array([len(tokenizer) - 1]), dtype, f"tokenizer {tokenizer.model_path}")
    start_build(out, ["train", "val"])
    writers = {s: ShardWriter(out / s, dtype, shard_bytes, compress=compress) for s in ("train", "val")}
    sinks = {s: Budgeted(writers[s], b, separator.id, dtype, s, separator.position)
             for s, b in zip(("train", "val"), budgets, strict=True)}
    return separator, writers, sinks


def pretrain_meta(tokenizer, dtype, final: Path, *, writers, sinks, records: dict, separator, seed: int,
                  dataset_name, dataset_config, streaming: bool, source, own_split: bool, exhausted: bool,
                  skipped: Counter, shard_bytes: int, shuffle_buffer, val_frac: float | None = None,
                  tokenizer_path: str | None = None, origins: bool = False, encoders: Counter | None = None) -> dict:
    """A pretraining cache's meta.json, from its closed writers and sinks (the one-process builder and the
    parallel build's commit write the same one). A callable `source` is called here, once the stream is read,
    so its skip counts are final. `encoders`: a parallel build's tasks by the encoder they ran (else this
    process's encoder is recorded)."""
    if callable(source):
        source = source()
    totals = {f"{s}_tokens": writers[s].tokens for s in ("train", "val")}
    totals.update({f"{s}_documents": sinks[s].documents for s in ("train", "val")})
    if totals["train_tokens"] + totals["val_tokens"] == 0:
        read = ", ".join((source or {}).get("files") or []) or (source or {}).get("dataset_id") or "the documents given"
        raise ConfigError(f"no tokens for {final}: {read} had no non-empty document "
                          f"(skipped: {all_skipped(skipped, source) or 'none'}); check the source")
    meta = common_meta(tokenizer, dtype, seed, dataset_name or final.name, dataset_config, streaming, source,
                       tokenizer_path)
    meta.update(encoder_record(tokenizer, encoders))
    meta.update({
        "kind": "pretrain",
        "split_rule": "the source's own train/val split" if own_split else
        split_rule(seed, val_frac, separator.position == "before")
        + _pieces_rule(source.get("val_per_input") if isinstance(source, dict) else None),
        "shard_bytes": shard_bytes,
        "shard_pattern": SHARD_PATTERN.replace("{:05d}", "NNNNN"),
        "document_separator": separator.describe(),
        "totals": totals,
        "files": records,
        "cuts": {s: sinks[s].cut for s in ("train", "val")},
        "source_exhausted": exhausted,
        "skipped": all_skipped(skipped, meta["source"]),
        "build": {"max_train_tokens": sinks["train"].budget, "max_val_tokens": sinks["val"].budget,
                  "shard_bytes": shard_bytes,
                  "seed": seed, "shuffle_buffer": shuffle_buffer, "encode_batch_docs": ENCODE_BATCH_DOCS,
                  **({"val_frac": val_frac} if val_frac is not None else {})},
    })
    if origins:  # origins.npy + origins.json (builders/origins.py)
        meta["origins"] = origins_meta()
    if writers["train"].compress:  # shard_NNNNN.bin.zst: frames and their index (formats/zstd_shard.py)
        meta["shard_pattern"] += SUFFIX
        meta["compression"] = compression_meta(writers["train"].frame_tokens)
    return meta
