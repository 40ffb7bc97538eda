"""Streaming builders of token caches: pretraining shards and SFT example streams.

Pretraining (`build_pretrain_cache`), one pass over the documents:
- documents flow through an optional torch-RNG shuffle buffer, then are encoded in batches
  (`encode_batch`, or a backend's own arrays); with several workers each batch is cut into runs encoded
  on that many threads (every backend's encoder releases the GIL): the output is the same for any count;
- each document is followed by one EOT; empty documents are skipped and counted;
- split rule: the first documents fill val until it holds exactly `max_val_tokens`, the rest fill
  train until exactly `max_train_tokens`; the document that crosses a budget keeps what fits, closed by its EOT, and the cut
  is recorded. Sources with their own split pass `SplitTexts(train=..., val=...)` instead;
- tokens go straight to `shard_00000.bin`, `shard_00001.bin`, ... (temporary names, renamed when
  full), each at most `shard_bytes`; reading stops as soon as both budgets are met;
- meta.json is written last. Memory: one encode batch plus the shuffle buffer, whatever the corpus.

SFT (`build_sft_cache`): each conversation is rendered (sentinel, content, EOT per message), sent to
val with probability `val_frac` (torch RNG, one draw per usable example, in stream order) and
appended to `{split}_tokens.bin`; its start offset goes to `{split}_idx.npy` (int64). A tokenizer with
its own chat template (niels_gpt.tokenizer.chat) renders with it instead; its ids carry no sentinel to
find the assistant spans by, so the mask is stored beside the tokens: `{split}_mask.bin`, one uint8 per
token (1 = a trained target), aligned with `{split}_tokens.bin`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from niels_gpt.atomic import atomic_path, remove_stale_temporaries
from niels_gpt.builders.encode_pool import EncodePool
from niels_gpt.constants import SEED  # noqa: F401  (re-exported under its old name)
from niels_gpt.encode import encode_documents
from niels_gpt.errors import ConfigError
from niels_gpt.formats.writers import (
    SHARD_PATTERN,
    Budgeted,
    HashingFile,
    ShardWriter,
    WriterPipeline,
    check_range,
    check_shard_bytes,
)
from niels_gpt.formats.zstd_shard import SUFFIX, compression_meta
from niels_gpt.meta import FORMAT_VERSION, META_NAME, meta_token_dtype, numpy_dtype, sha256_file, write_meta
from niels_gpt.progress import BuildProgress, should_show
from niels_gpt.seeds import check_seed
from niels_gpt.staging import build_aside
from niels_gpt.storage.upload import writes_to_url
from niels_gpt.tokenizer.base import (
    Message,  # noqa: F401  (the contract's Message type lives here too)
    document_separator,
)

SHARD_BYTES = 128 * 1024 * 1024
MAX_TRAIN_TOKENS = 200_000_000
MAX_VAL_TOKENS = 5_000_000
SHUFFLE_BUFFER = None
VAL_FRAC = 0.10
ENCODE_BATCH_DOCS = 256  # documents per encode_batch call
SPLIT_RULE = ("stream order: the first documents fill val up to max_val_tokens, the rest fill train up to "
              "max_train_tokens; the document crossing a budget keeps its first (room - 1) tokens and its EOT")
SPLIT_RULE_BOS = ("stream order: the first documents fill val up to max_val_tokens, the rest fill train up to "
                  "max_train_tokens; the document crossing a budget keeps its BOS and its first (room - 1) tokens")


class SplitTexts(NamedTuple):
    """Documents of a source that defines its own train/val split."""

    train: Iterable[str]
    val: Iterable[str]


def shuffled(items: Iterable, size: int | None, generator: torch.Generator) -> Iterator:
    """Approximate shuffle in O(size) memory: keep `size` items, emit a random one per new arrival."""
    if not size or size <= 1:
        yield from items
        return
    buf: list = []
    draws: list[int] = []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        if not draws:  # one torch call per 4096 draws: same values as drawing one at a time
            draws = torch.randint(size, (4096,), generator=generator).tolist()[::-1]
        j = draws.pop()
        yield buf[j]
        buf[j] = item
    for j in torch.randperm(len(buf), generator=generator).tolist():
        yield buf[j]


def _resolve_dtype(tokenizer, token_dtype: str | None) -> np.dtype:
    if token_dtype is None:
        return np.dtype(tokenizer.token_dtype)
    return numpy_dtype(token_dtype)


def _read_batches(texts: Iterable[str], batch_docs: int = ENCODE_BATCH_DOCS) -> Iterator[tuple[list[str], int]]:
    """(non-empty documents, number of empty ones skipped) per batch of `batch_docs` documents."""
    it = iter(texts)
    while batch := list(itertools.islice(it, batch_docs)):
        kept = []
        for t in batch:
            if not isinstance(t, str):
                raise ConfigError(f"documents must be str, got {type(t).__name__}: {t!r:.80}")
            if t and not t.isspace():  # what t.strip() tests, without copying the document
                kept.append(t)
        yield kept, len(batch) - len(kept)


def _encoded_batches(texts: Iterable[str], tokenizer, pool, workers: int,
                     skipped: Counter) -> Iterator[list[list[int]]]:
    """Encoded documents, batch by batch, in stream order.

    One worker encodes on this thread. More workers: each batch is cut into `2 * workers` runs of
    consecutive documents of about equal characters (`_pieces`), each run encoded by one call on a worker of
    `pool` (a thread: the encoders release the GIL; a forked process for tiktoken, niels_gpt/builders/
    encode_pool.py), at most `2 * workers` batches in flight, results joined in order.
    Every document is encoded alone whatever the cut, so the ids do not depend on it.
    NOTE: on debian-docs a 256-document batch is ~2 M characters, so a 10 M-character build is only ~5
    batches: with a whole batch per thread the last round left a core idle (spm 2 workers 1.56x the bare
    1-thread rate); runs of a batch keep both busy to the end (1.67x; bench/bench_tokenizers.py). Empty
    documents are counted when their batch is consumed, not when it is read, so meta.json does not depend
    on how far ahead the workers have read.
    """
    batches = _read_batches(texts)
    if pool is None:
        encoded = ((encode_documents(tokenizer, kept, 1, arrays=True), n) for kept, n in batches)
    else:
        encoded = _in_order(pool, batches, workers)
    for docs, n_skipped in encoded:
        skipped["empty_document"] += n_skipped
        yield docs


def _pieces(docs: list[str], n: int) -> list[list[str]]:
    """`docs` cut into at most `n` runs of consecutive documents of about equal characters."""
    if n <= 1 or len(docs) <= 1:
        return [docs]
    lengths = list(itertools.accumulate(map(len, docs)))
    step = lengths[-1] / n
    out: list[list[str]] = []
    start = 0
    for i, end in enumerate(lengths[:-1]):
        if end >= step * (len(out) + 1):
            out.append(docs[start:i + 1])
            start = i + 1
            if len(out) == n - 1:
                break
    out.append(docs[start:])
    return out


def _encode_pieces(pool: EncodePool, docs: list[str], n: int) -> list:
    return [pool.encode(piece) for piece in _pieces(docs, n)]


def _joined(futures: list) -> list:
    if len(futures) == 1:
        return futures[0].result()
    return [ids for future in futures for ids in future.result()]


def _in_order(pool: EncodePool, batches, workers: int):
    window = 2 * workers
    pending: deque = deque()
    for kept, n in batches:
        pending.append((_encode_pieces(pool, kept, window), n))
        if len(pending) >= window:
            futures, n_done = pending.popleft()
            yield _joined(futures), n_done
    while pending:
        futures, n_done = pending.popleft()
        yield _joined(futures), n_done


def _encode_threads(num_workers: int | None) -> int:
    """Encode threads: `num_workers`, or one per core for None."""
    workers = (os.cpu_count() or 1) if num_workers is None else num_workers
    if workers < 1:
        raise ConfigError(f"num_workers must be >= 1 (or None for one per core), got {num_workers}")
    return workers


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
    compress: str | None = None,
) -> None:
    """
    writes:
      out_dir/train/shard_*.bin
      out_dir/val/shard_*.bin
      out_dir/meta.json
    token dtype: uint16 little-endian (uint32 when the tokenizer has more than 65,536 ids)
    deterministic given seed + identical input stream order.

    `texts` is one stream (split by the rule in the module docstring) or `SplitTexts` for a source
    with its own split. `num_workers` encode workers, each encoding runs of a batch (None: one per
    core): threads, or forked processes for a tokenizer whose encoder does not scale on threads (tiktoken;
    niels_gpt/builders/encode_pool.py); the bytes written do not depend on it. `progress`: a bar on stderr (None: on a terminal only);
    `input_bytes`: the input's size, for a bar with a real ETA (niels_gpt.progress). `compress="zstd"`:
    shards as zstd frames with a frame index (`shard_*.bin.zst`, niels_gpt/formats/zstd_shard.py).
    """
    for name, value in (("max_train_tokens", max_train_tokens), ("max_val_tokens", max_val_tokens)):
        if value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")
    if max_train_tokens == 0 and max_val_tokens == 0:
        raise ConfigError(f"{out_dir}: max_train_tokens and max_val_tokens are both 0, so nothing would be built; "
                          "give either a positive budget (--max-train-tokens / --max-val-tokens)")
    check_seed(seed)
    check_shard_bytes(shard_bytes)
    final = Path(out_dir)
    budget_bytes = (max_train_tokens + max_val_tokens) * np.dtype(_resolve_dtype(tokenizer, token_dtype)).itemsize
    with build_aside(final, needs=budget_bytes if budget_bytes < 1 << 50 else None) as out:
        dtype = _resolve_dtype(tokenizer, token_dtype)
        separator = document_separator(tokenizer)  # our EOT, or a user tokenizer's EOS after (or BOS before) each document
        eot = separator.id
        check_range(np.array([len(tokenizer) - 1]), dtype, f"tokenizer {tokenizer.model_path}")
        workers = _encode_threads(num_workers)
        _start_build(out, ["train", "val"])
        skipped: Counter = Counter()
        writers = {s: ShardWriter(out / s, dtype, shard_bytes, compress=compress) for s in ("train", "val")}
        sinks = {s: Budgeted(writers[s], b, eot, dtype, s, separator.position)
                 for s, b in (("train", max_train_tokens), ("val", max_val_tokens))}
        own_split = isinstance(texts, SplitTexts)
        # first: a pool of forked processes (a tokenizer that asks for them) starts before any thread here
        pool = EncodePool(tokenizer, workers) if workers > 1 else None
        bar = BuildProgress(f"pretrain {dataset_name or final.name}", progress=progress, input_bytes=input_bytes)
        exhausted = True
        failed = False
        pipe = WriterPipeline()
        # NOTE: with the writes overlapped, the main thread spends ~95% of a build inside sentencepiece.
        # debian-docs, 30 M chars, 2-core VM (bench/bench_cache_build.py, best of 5): 1 worker 5.6 Mtok/s
        # = 0.79x bare SentencePieceTokenizer.encode (0.95-1.1x in quiet single runs), 2 workers 1.74x
        # the 1-worker rate; the per-document int -> array path was 0.14 s of a 0.84 s build, now ~0.06
        # and off the encoding thread. Per backend (bench/bench_tokenizers.py --repeat 5, debian-docs 10 M
        # chars, the same 2-core VM in a quiet run; noisy runs and the figures before in its docstring),
        # against the backend's bare 1-thread encoder: 1 worker sentencepiece 0.93x, tokenizers 0.99x,
        # tiktoken 1.01x (its arrays skip the Python ints the bare encoder makes); 2 workers 1.67x, 1.91x and
        # 1.39x (1.56x, 1.49x and 0.69x when each thread took whole batches). tiktoken on two threads of one
        # process gains 1.2-1.4x, on two processes 1.9x: its workers are forked processes now (cl100k_base,
        # 2 workers: 1.47x -> 1.79x its bare 1-thread encoder; encode_pool.py).
        try:
            if own_split:
                for split in ("val", "train"):
                    # one generator per split: reading ahead in val never shifts train's draws
                    gen = torch.Generator().manual_seed(seed + (split == "train"))
                    docs = shuffled(bar.documents(getattr(texts, split)), shuffle_buffer, gen)
                    sink = sinks[split]
                    # A batch is read only after a document of the previous one found the split full
                    # (not merely when it became full): the stream is read, and the shuffle's RNG
                    # drawn, exactly as far as a document-at-a-time loop would.
                    for batch in _encoded_batches(docs, tokenizer, pool, workers, skipped):
                        job: list = []
                        stop = False
                        for ids in batch:
                            if sink.full:
                                stop = True
                                break
                            bar.add_tokens(sink.plan(ids, job))
                        pipe.submit(job)
                        if stop:
                            break
            else:
                exhausted = False
                docs = shuffled(bar.documents(texts), shuffle_buffer, torch.Generator().manual_seed(seed))
                order = [sinks["val"], sinks["train"]]
                for batch in _encoded_batches(docs, tokenizer, pool, workers, skipped):
                    job = []
                    for ids in batch:
                        while order and order[0].full:
                            order.pop(0)
                        if not order:
                            break
                        bar.add_tokens(order[0].plan(ids, job))
                    pipe.submit(job)
                    if not order:
                        break
                else:
                    exhausted = True
            pipe.close()
            records = {f"{s}/{name}": rec for s in ("train", "val") for name, rec in writers[s].close().items()}
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
        if callable(source):  # described after the stream was read, so its skip counts are final
            source = source()
        meta = pretrain_meta(tokenizer, dtype, final, writers=writers, sinks=sinks, records=records, eot=eot,
                             seed=seed, dataset_name=dataset_name, dataset_config=dataset_config,
                             streaming=streaming, source=source, own_split=own_split, exhausted=exhausted,
                             skipped=skipped, shard_bytes=shard_bytes, shuffle_buffer=shuffle_buffer,
                             budgets=(max_train_tokens, max_val_tokens), separator=separator)
        write_meta(str(out), meta)


def pretrain_meta(tokenizer, dtype, final: Path, *, writers, sinks, records: dict, eot: int, seed: int,
                  dataset_name, dataset_config, streaming: bool, source: dict | None, own_split: bool,
                  exhausted: bool, skipped: Counter, shard_bytes: int, shuffle_buffer, budgets,
                  separator=None) -> dict:
    """A pretraining cache's meta.json, from its closed writers and budgets (the one-process builder and the
    distributed build's commit write the same one)."""
    totals = {f"{s}_tokens": writers[s].tokens for s in ("train", "val")}
    totals.update({f"{s}_documents": sinks[s].documents for s in ("train", "val")})
    if totals["train_tokens"] + totals["val_tokens"] == 0:
        read = ", ".join((source or {}).get("files") or []) or (source or {}).get("dataset_id") or "the documents given"
        raise ConfigError(f"no tokens for {final}: {read} had no non-empty document "
                          f"(skipped: {all_skipped(skipped, source) or 'none'}); check the source")
    meta = _common_meta(tokenizer, dtype, seed, dataset_name or final.name, dataset_config, streaming, source)
    meta.update({
        "kind": "pretrain",
        "split_rule": ("the source's own train/val split" if own_split
                       else SPLIT_RULE_BOS if separator is not None and separator.position == "before" else SPLIT_RULE),
        "shard_bytes": shard_bytes,
        "shard_pattern": SHARD_PATTERN.replace("{:05d}", "NNNNN"),
        "document_separator": (separator.describe() if separator is not None
                               else {"token": "eot", "id": eot, "position": "after every document"}),
        "totals": totals,
        "files": records,
        "cuts": {s: sinks[s].cut for s in ("train", "val")},
        "source_exhausted": exhausted,
        "skipped": all_skipped(skipped, meta["source"]),
        "build": {"max_train_tokens": budgets[0], "max_val_tokens": budgets[1], "shard_bytes": shard_bytes,
                  "seed": seed, "shuffle_buffer": shuffle_buffer, "encode_batch_docs": ENCODE_BATCH_DOCS},
    })
    if writers["train"].compress:  # shard_NNNNN.bin.zst: frames and their index (formats/zstd_shard.py)
        meta["shard_pattern"] += SUFFIX
        meta["compression"] = compression_meta(writers["train"].frame_tokens)
    return meta


SFT_DRAW_BLOCK = 1024


def sft_split_rule(seed: int, val_frac: float) -> str:
    """The SFT split in words precise enough to recompute it (tests/test_build_cache.py does)."""
    return (f"by example: g = torch.Generator().manual_seed({seed}); draws = the concatenation of "
            f"torch.rand({SFT_DRAW_BLOCK}, generator=g, dtype=torch.float64) calls, taken in order; the k-th "
            f"usable example of the stream (0-based, in stream order; skipped examples take no draw) goes to "
            f"val when draws[k] < {val_frac!r}, else to train")


@writes_to_url
def build_sft_cache(
    examples: Iterable[list[Message]],
    out_dir: str,
    *,
    tokenizer,
    val_frac: float,
    seed: int,
    token_dtype: str | None = None,
    dataset_name: str | None = None,
    dataset_config: str | None = None,
    streaming: bool = False,
    source: dict | Callable[[], dict] | None = None,
    progress: bool | None = False,
    num_workers: int | None = 1,
) -> None:
    """
    writes:
      out_dir/train_tokens.bin, out_dir/train_idx.npy
      out_dir/val_tokens.bin,   out_dir/val_idx.npy
      out_dir/meta.json
    where idx is offsets into tokens.bin (int64), offsets-only (length inferred).
    deterministic given seed + identical input stream order.
    """
    from tqdm.auto import tqdm

    if not 0.0 <= val_frac < 1.0:
        raise ConfigError(f"val_frac must be in [0, 1), got {val_frac}")
    check_seed(seed)
    final = Path(out_dir)
    with build_aside(final) as out:
        dtype = _resolve_dtype(tokenizer, token_dtype)
        _start_build(out, [])
        gen = torch.Generator().manual_seed(seed)
        workers = _encode_threads(num_workers)
        skipped: Counter = Counter()
        stored_mask = not getattr(tokenizer, "library_conventions", True)
        files = {s: HashingFile(out / f"{s}_tokens.bin") for s in ("train", "val")}
        if stored_mask:
            files.update({f"{s}_mask": HashingFile(out / f"{s}_mask.bin") for s in ("train", "val")})
        trained = {"train": 0, "val": 0}
        offsets: dict[str, list[int]] = {"train": [], "val": []}
        tokens = {"train": 0, "val": 0}
        draws: list[float] = []
        try:
            shown = tqdm(examples, unit="ex", desc=f"sft {dataset_name or final.name}",
                         disable=not should_show(progress), file=sys.stderr)
            for i, conv, chat in _rendered(shown, tokenizer, workers):
                reason = _unusable(conv)
                if reason:
                    skipped[reason] += 1
                    continue
                if isinstance(chat, ConfigError):
                    raise ConfigError(f"{dataset_name or final.name} example {i}: {chat}") from chat
                ids = np.asarray(chat.ids, dtype=np.int64)
                check_range(ids, dtype, f"example {i}")
                if stored_mask and not any(chat.mask):
                    skipped["no_trained_token"] += 1
                    continue
                if not draws:
                    draws = torch.rand(SFT_DRAW_BLOCK, generator=gen, dtype=torch.float64).tolist()[::-1]
                split = "val" if draws.pop() < val_frac else "train"
                offsets[split].append(tokens[split])
                files[split].write(ids.astype(dtype))
                if stored_mask:
                    files[f"{split}_mask"].write(np.asarray(chat.mask, dtype=np.uint8))
                    trained[split] += int(sum(chat.mask))
                tokens[split] += len(ids)
            records = {}
            for s in ("train", "val"):
                records[f"{s}_tokens.bin"] = {**files[s].close(), "tokens": tokens[s]}
                if stored_mask:
                    records[f"{s}_mask.bin"] = {**files[f"{s}_mask"].close(), "trained_tokens": trained[s]}
                idx_path = out / f"{s}_idx.npy"
                with atomic_path(idx_path) as tmp:
                    with open(tmp, "wb") as f:
                        np.save(f, np.asarray(offsets[s], dtype="<i8"), allow_pickle=False)
                records[f"{s}_idx.npy"] = {"bytes": idx_path.stat().st_size, "sha256": sha256_file(str(idx_path)),
                                           "examples": len(offsets[s])}
        except BaseException:
            for f in files.values():
                f.abort()
            raise
        if not offsets["train"] and not offsets["val"]:
            raise ConfigError(f"no usable conversation for {final} (skipped: {dict(skipped) or 'none'}): "
                              "every example lacked an assistant turn or was empty")
        if callable(source):  # described after the stream was read, so its skip counts are final
            source = source()
        meta = _common_meta(tokenizer, dtype, seed, dataset_name or final.name, dataset_config, streaming, source)
        meta.update({
            "kind": "sft",
            "split_rule": sft_split_rule(seed, val_frac),
            "val_frac": val_frac,
            "rendering": (CHAT_TEMPLATE_RENDERING if stored_mask else
                          "per message: role sentinel, content tokens, EOT; trained span = assistant content + its EOT"),
            "totals": {"train_examples": len(offsets["train"]), "val_examples": len(offsets["val"]),
                       "train_tokens": tokens["train"], "val_tokens": tokens["val"]},
            "files": records,
            "skipped": all_skipped(skipped, meta["source"]),
            "build": {"val_frac": val_frac, "seed": seed},
        })
        if stored_mask:
            meta["assistant_mask"] = {"file": "{split}_mask.bin", "dtype": "uint8", "meaning": "1 = trained target"}
        write_meta(str(out), meta)


CHAT_TEMPLATE_RENDERING = ("the tokenizer's chat template (niels_gpt.tokenizer.chat); trained tokens = the text each "
                           "assistant message adds (content + the template's end of turn), stored in {split}_mask.bin")


def _unusable(conv) -> str | None:
    if not isinstance(conv, list | tuple) or not conv:
        return "empty_conversation"
    has_answer = False
    for m in conv:
        if isinstance(m, dict) and m.get("role") == "assistant":
            has_answer = has_answer or bool(str(m.get("content", "")).strip())
    return None if has_answer else "no_assistant_turn"


def _start_build(out: Path, split_dirs: list[str]) -> None:
    """Uncommit any previous cache here (meta first), clear its token files and the temporaries of killed
    builds (`*.tmp-<pid>` of a process that no longer runs)."""
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(out / META_NAME)
    for sub in split_dirs:
        d = out / sub
        d.mkdir(exist_ok=True)
        for old in d.glob("shard_*.bin"):
            old.unlink()


def _render(tokenizer, conv):
    """One conversation rendered, None when unusable (the caller counts why), or the ConfigError to raise."""
    if _unusable(conv):
        return None
    try:
        return tokenizer.render_chat(conv)
    except ConfigError as exc:
        return exc


def _rendered(examples: Iterable, tokenizer, workers: int) -> Iterator[tuple[int, object, object]]:
    """(index, conversation, rendering) in input order; renderings of a run of ENCODE_BATCH_DOCS
    conversations are made on `workers` threads at once (the bytes written do not depend on it)."""
    it = enumerate(examples)
    if workers <= 1:
        for i, conv in it:
            yield i, conv, _render(tokenizer, conv)
        return
    with ThreadPoolExecutor(workers) as pool:
        while batch := list(itertools.islice(it, ENCODE_BATCH_DOCS)):
            for (i, conv), chat in zip(batch, pool.map(lambda ic: _render(tokenizer, ic[1]), batch), strict=True):
                yield i, conv, chat


def all_skipped(own: Counter, source: dict | None) -> dict:
    """Records skipped by the builder and by the source (what it dropped while reading), by reason."""
    out = dict(own)
    for reason, n in ((source or {}).get("skipped") or {}).items():
        out[reason] = out.get(reason, 0) + int(n)
    return dict(sorted(out.items()))


def _common_meta(tokenizer, dtype, seed, name, config, streaming, source) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "built": True,
        "dataset_name": name,
        "dataset_config": config,
        "seed": seed,
        "token_dtype": meta_token_dtype(dtype),
        "tokenizer_sha256": tokenizer.sha256,
        "tokenizer": tokenizer.describe(),
        "vocab_size": len(tokenizer),
        "special_token_ids": dict(tokenizer.special_ids),
        "streaming": streaming,
        "source": source,
        "randomness": "torch.Generator only",
    }
