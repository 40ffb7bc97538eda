"""Builders for the format tests: hand-made caches of our layout, a real-text cache, a 70k-id tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ..conftest import write_pretrain_cache

EOT = 6  # the layout of a trained sentencepiece model: specials at 3..6, <s> = 1
SPECIALS = {"sys": 3, "usr": 4, "asst": 5, "eot": EOT}


def make_cache(out: Path, shards: dict[str, list], *, dtype: str = "uint16-le", vocab_size: int = 2004,
               eot: int = EOT) -> Path:
    """Our pretraining layout, written by hand: each shard holds exactly the given tokens."""
    return write_pretrain_cache(out, shards, dtype=dtype, vocab_size=vocab_size, eot=eot)


def tokens_of(path, **kw) -> dict[str, list[int]]:
    """Every token of a corpus in any format, per split ('-' for a single stream)."""
    from niels_gpt.cache.formats import detect_format

    info = detect_format(path, **kw)
    out = {}
    for name, leaf in (info.splits or {"-": info}).items():
        arrays = [np.asarray(t.open(), dtype=np.int64) for t in leaf.token_files]
        out[name] = np.concatenate(arrays).tolist() if arrays else []
    return out


@pytest.fixture
def small_cache(tmp_path) -> Path:
    """Two train shards (a document runs across them, one is empty) and one val shard."""
    return make_cache(tmp_path / "cache", {
        "train": [[10, 11, 12, EOT, 13, 14], [EOT, EOT, 15, EOT]],
        "val": [[16, 17, EOT]],
    })


@pytest.fixture(scope="session")
def real_cache(tokenizer, real_docs, tmp_path_factory) -> Path:
    """A cache built by the real builder from the sample corpus (val is cut at its budget)."""
    from niels_gpt.cache.build_cache import build_pretrain_cache

    out = tmp_path_factory.mktemp("real") / "cache"
    build_pretrain_cache(real_docs, str(out), tokenizer=tokenizer, max_train_tokens=30_000,
                         max_val_tokens=3_000, shard_bytes=16_384, seed=7, shuffle_buffer=None)
    return out


BIG_VOCAB_WORDS = 70_000  # > 65,536: ids need uint32


@pytest.fixture(scope="session")
def big_tokenizer(tmp_path_factory):
    """A Hugging Face WordLevel tokenizer with 70,006 ids, built in-process, saved as tokenizer.json."""
    tokenizers = pytest.importorskip("tokenizers")
    from niels_gpt.tokenizer.hf import HFTokenizer, add_special_tokens_to

    words = [f"w{i}" for i in range(BIG_VOCAB_WORDS)]
    vocab = {"[UNK]": 0, "<s>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    add_special_tokens_to(tok)
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    tok.save(str(path))
    return HFTokenizer(path)


@pytest.fixture
def cache_maker():
    """make_cache, for tests (conftest is not importable under --import-mode=importlib)."""
    return make_cache


@pytest.fixture
def read_tokens():
    return tokens_of
