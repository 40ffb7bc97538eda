"""Real token caches for the benches: the shared real corpora tokenized by a sentencepiece model trained on them.

Text: ../shared/data (debian-docs, the ten Gutenberg books, wikitext-2 valid, tinyshakespeare), ~60 MB of
English prose and technical documentation. Tokenizer: a VOCAB-id sentencepiece unigram trained on the first
TRAIN_CHARS characters of it. The cache is built by the library's own builder (`build_pretrain_cache`), once
per work directory: a later run with the same --work reuses it.
"""

from __future__ import annotations

import json
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
VOCAB = 16_000
TRAIN_CHARS = 5_000_000


def documents():
    """Every document of the real corpora, read lazily."""
    with open(SHARED / "bulk-text" / "debian-docs.jsonl", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]
    for path in [*sorted((SHARED / "gutenberg").glob("*.txt")), SHARED / "wikitext" / "wikitext-2-raw.wiki.valid.raw",
                 SHARED / "tinyshakespeare" / "input.txt"]:
        yield path.read_text(encoding="utf-8-sig")


def tokenizer(work: Path, vocab: int = VOCAB):
    from niels_gpt.tokenizer import TrainSettings, load_tokenizer, train_tokenizer

    out = work / f"tokenizer-{vocab}"
    if (out / "meta.json").is_file():
        return load_tokenizer(out)

    def head():
        n = 0
        for d in documents():
            yield d
            n += len(d)
            if n >= TRAIN_CHARS:
                return

    return train_tokenizer(head(), out, settings=TrainSettings(vocab_size=vocab))


def real_cache(work: Path, *, shard_bytes: int, compress: str | None = None, vocab: int = VOCAB) -> Path:
    """The real corpora as a pretraining cache (all train but 100k val tokens) under `work`."""
    from niels_gpt.cache.build_cache import build_pretrain_cache

    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED} is absent: these benches read the shared real corpora")
    out = work / f"cache-{vocab}-{shard_bytes}-{compress or 'raw'}"
    if not (out / "meta.json").is_file():
        build_pretrain_cache(documents(), str(out), tokenizer=tokenizer(work, vocab), max_train_tokens=10**12,
                             max_val_tokens=100_000, shard_bytes=shard_bytes, seed=0, shuffle_buffer=None,
                             compress=compress, dataset_name="shared-real-corpora")
    return out
