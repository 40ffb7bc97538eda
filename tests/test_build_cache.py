"""Pretraining builder: budgets, shard rollover, range checks, failure leaves nothing complete."""

import numpy as np
import pytest

from niels_gpt.builders.encoding import shuffled
from niels_gpt.builders.pretrain import SplitTexts
from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.cache.meta import read_meta
from niels_gpt.errors import CacheError, ConfigError

TEXTS = [f"Paragraph {i}. " + "The quick brown fox jumps over the lazy dog. " * (1 + i % 5) for i in range(200)]


def _build(out, tokenizer, texts=TEXTS, **kw):
    args = dict(tokenizer=tokenizer, max_train_tokens=2000, max_val_tokens=300, shard_bytes=1000, seed=0,
                shuffle_buffer=None)
    args.update(kw)
    build_pretrain_cache(texts, str(out), **args)
    return read_meta(str(out))


def _tokens(out, split):
    return np.concatenate([np.fromfile(p, dtype="<u2") for p in sorted((out / split).glob("shard_*.bin"))])


def test_budgets_are_met_exactly_and_the_cut_is_recorded(tmp_path, tokenizer):
    meta = _build(tmp_path / "c", tokenizer)
    assert meta["totals"]["train_tokens"] == 2000 and meta["totals"]["val_tokens"] == 300
    assert len(_tokens(tmp_path / "c", "train")) == 2000
    cut = meta["cuts"]["train"]
    assert 0 < cut["kept_tokens"] < cut["document_tokens"]
    assert meta["source_exhausted"] is False


def test_first_documents_fill_val_then_train(tmp_path, tokenizer):
    _build(tmp_path / "c", tokenizer)
    eot = tokenizer.eot_id
    val = _tokens(tmp_path / "c", "val")
    expected = np.concatenate([tokenizer.encode(t) + [eot] for t in TEXTS[:20]])[:299].tolist() + [eot]
    assert val.tolist() == expected  # the 300th token closes the cut document


def test_a_document_cut_by_a_budget_still_ends_with_eot(tmp_path, tokenizer):
    meta = _build(tmp_path / "c", tokenizer)
    for split in ("train", "val"):
        tokens = _tokens(tmp_path / "c", split)
        assert tokens[-1] == tokenizer.eot_id
        assert (tokens == tokenizer.eot_id).sum() == meta["totals"][f"{split}_documents"]
        cut = meta["cuts"][split]
        last = tokens[:-1][np.flatnonzero(tokens[:-1] == tokenizer.eot_id)[-1] + 1:]
        assert len(last) == cut["kept_content_tokens"] == cut["kept_tokens"] - 1


def test_every_document_ends_with_eot(tmp_path, tokenizer):
    _build(tmp_path / "c", tokenizer, max_train_tokens=10**9, max_val_tokens=0)
    train = _tokens(tmp_path / "c", "train")
    assert (train == tokenizer.eot_id).sum() == len(TEXTS) and train[-1] == tokenizer.eot_id
    pieces = np.split(train, np.flatnonzero(train == tokenizer.eot_id)[:-1] + 1)
    assert [tokenizer.decode(p[:-1].tolist()) for p in pieces] == TEXTS


def test_shards_roll_over_at_the_byte_target_and_none_is_empty(tmp_path, tokenizer):
    meta = _build(tmp_path / "c", tokenizer, shard_bytes=998)  # 499 tokens per shard
    sizes = [p.stat().st_size for p in sorted((tmp_path / "c" / "train").glob("shard_*.bin"))]
    assert sizes[:-1] == [998] * (len(sizes) - 1) and 0 < sizes[-1] <= 998
    assert sum(sizes) == 4000 and len(sizes) == 5
    assert len(meta["files"]) == 6  # 5 train shards + 1 val shard
    _build(tmp_path / "d", tokenizer, max_val_tokens=0)
    assert not list((tmp_path / "d" / "val").glob("*"))


def test_split_texts_honour_the_sources_own_split(tmp_path, tokenizer):
    meta = _build(tmp_path / "c", tokenizer, texts=SplitTexts(train=TEXTS[:5], val=TEXTS[5:7]),
                  max_train_tokens=10**9, max_val_tokens=10**9)
    assert meta["totals"]["train_documents"] == 5 and meta["totals"]["val_documents"] == 2
    assert "own" in meta["split_rule"]


def test_empty_documents_are_skipped_and_counted(tmp_path, tokenizer):
    meta = _build(tmp_path / "c", tokenizer, texts=["", "  \n", "real text"], max_val_tokens=0)
    assert meta["skipped"] == {"empty_document": 2} and meta["totals"]["train_documents"] == 1


def test_rejects_token_id_above_uint16(tmp_path, tokenizer):
    class WideTokenizer:
        sha256, model_path, special_ids = "x" * 64, "wide", {"sys": 3, "usr": 4, "asst": 5, "eot": 6}
        token_dtype = np.dtype("<u2")

        def __len__(self):
            return 100

        def encode_batch(self, texts, num_threads=None):
            return [[7, 65536] for _ in texts]

    with pytest.raises(CacheError, match="token id 65536 does not fit uint16 .*uint32-le"):
        _build(tmp_path / "c", WideTokenizer())
    assert not (tmp_path / "c" / "meta.json").exists()
    assert not list((tmp_path / "c").rglob("*.tmp-*"))


def test_rejects_tokenizer_too_large_for_forced_uint16(tmp_path, tokenizer):
    class Big:
        sha256, model_path, special_ids = "x" * 64, "big.model", {"eot": 6}

        def __len__(self):
            return 70_000

    with pytest.raises(CacheError, match="tokenizer big.model: token id 69999 does not fit uint16"):
        _build(tmp_path / "c", Big(), token_dtype="uint16-le")


def test_empty_input_is_an_error_and_leaves_no_meta(tmp_path, tokenizer):
    with pytest.raises(ConfigError, match="no tokens .*no non-empty document"):
        _build(tmp_path / "c", tokenizer, texts=[])
    assert not (tmp_path / "c" / "meta.json").exists()


def test_a_failed_rebuild_leaves_the_finished_cache_untouched(tmp_path, tokenizer):
    _build(tmp_path / "c", tokenizer)  # a finished cache ...
    before = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}

    def dying():
        yield from TEXTS[:50]
        raise OSError("disk on fire")

    with pytest.raises(OSError, match="disk on fire"):  # ... rebuilt, and the rebuild dies
        _build(tmp_path / "c", tokenizer, texts=dying(), max_train_tokens=10**9)
    after = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    assert after == before  # the old cache, byte for byte; no staging directory, no lock left
    from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset

    PretrainTokenStreamDataset(str(tmp_path / "c" / "train"), T=4, device="cpu")


def test_a_killed_first_build_leaves_nothing_that_looks_complete(tmp_path, tokenizer):
    def dying():
        yield from TEXTS[:50]
        raise OSError("disk on fire")

    with pytest.raises(OSError, match="disk on fire"):
        _build(tmp_path / "c", tokenizer, texts=dying(), max_train_tokens=10**9)
    assert not (tmp_path / "c").exists() and not list(tmp_path.iterdir())


def test_rejects_non_string_documents(tmp_path, tokenizer):
    with pytest.raises(ConfigError, match="documents must be str, got int"):
        _build(tmp_path / "c", tokenizer, texts=["ok", 5])


def test_shuffle_buffer_is_a_seeded_permutation():
    from niels_gpt.seeds import TorchDraws

    items = list(range(1000))
    a = list(shuffled(items, 64, TorchDraws(1)))
    b = list(shuffled(items, 64, TorchDraws(1)))
    c = list(shuffled(items, 64, TorchDraws(2)))
    assert a == b != c and sorted(a) == items and a != items


def test_stops_reading_the_stream_once_budgets_are_met(tmp_path, tokenizer):
    consumed = []

    def endless():
        i = 0
        while True:
            consumed.append(i)
            yield f"document number {i} with some words"
            i += 1

    _build(tmp_path / "c", tokenizer, texts=endless(), max_train_tokens=500, max_val_tokens=100)
    assert len(consumed) < 2000


def test_sft_split_rule_text_is_enough_to_recompute_the_split(tmp_path, tokenizer):
    """Follow meta.json's split_rule word for word (2,500 examples: the draws span three blocks)."""
    import re

    import torch

    from niels_gpt.cache.build_cache import build_sft_cache

    convs = []
    for i in range(2500):
        if i % 7 == 3:
            convs.append([{"role": "user", "content": f"q{i}"}])  # unusable: no assistant turn, no draw
        else:
            convs.append([{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}])
    build_sft_cache(convs, tmp_path / "sft", tokenizer=tokenizer, val_frac=0.3, seed=1234)
    meta = read_meta(tmp_path / "sft")
    rule = meta["split_rule"]
    seed = int(re.search(r"manual_seed\((\d+)\)", rule).group(1))
    block = int(re.search(r"torch\.rand\((\d+), generator=g, dtype=torch\.float64\)", rule).group(1))
    frac = float(re.search(r"draws\[k\] < ([0-9.]+)", rule).group(1))
    assert "skipped examples take no draw" in rule
    g = torch.Generator().manual_seed(seed)
    draws = torch.cat([torch.rand(block, generator=g, dtype=torch.float64) for _ in range(3)])
    usable = [c for c in convs if len(c) == 2]
    expected_val = [c[0]["content"] for k, c in enumerate(usable) if draws[k] < frac]
    idx = np.load(tmp_path / "sft" / "val_idx.npy")
    toks = np.fromfile(tmp_path / "sft" / "val_tokens.bin", dtype="<u2")
    bounds = list(idx) + [len(toks)]
    got_val = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        text = tokenizer.decode(toks[a:b].tolist())
        got_val.append(re.search(r"q\d+", text).group(0))
    assert got_val == expected_val
    assert sum(meta["skipped"].values()) == len(convs) - len(usable)
