"""Contract acceptance test 4: same input and seed -> byte-identical cache files."""

import hashlib
from pathlib import Path

from niels_gpt.cache.build_cache import build_pretrain_cache, build_sft_cache

TEXTS = [f"Document {i}: " + " ".join(f"word{(i * 7 + k) % 53}" for k in range(5 + i % 17)) for i in range(300)]
CONVS = [[{"role": "user", "content": f"question {i}?"}, {"role": "assistant", "content": f"answer {i * i}."}]
         for i in range(120)]


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _pretrain(parent, tokenizer, seed, workers=1, shuffle=64):
    out = parent / "cache"  # same name: dataset_name in meta.json defaults to it
    build_pretrain_cache(iter(TEXTS), str(out), tokenizer=tokenizer, max_train_tokens=3000, max_val_tokens=500,
                         shard_bytes=1000, seed=seed, shuffle_buffer=shuffle, num_workers=workers)
    return _digests(out)


def test_pretrain_cache_is_byte_identical_for_same_input_and_seed(tmp_path, tokenizer):
    a = _pretrain(tmp_path / "a", tokenizer, seed=5)
    b = _pretrain(tmp_path / "b", tokenizer, seed=5)
    assert a == b
    assert len([k for k in a if k.endswith(".bin")]) >= 4  # several shards compared, meta.json too


def test_pretrain_cache_differs_for_another_seed(tmp_path, tokenizer):
    a = _pretrain(tmp_path / "a", tokenizer, seed=5)
    c = _pretrain(tmp_path / "c", tokenizer, seed=6)
    assert a["train/shard_00000.bin"] != c["train/shard_00000.bin"]


def test_pretrain_output_does_not_depend_on_worker_count(tmp_path, tokenizer):
    one = _pretrain(tmp_path / "one", tokenizer, seed=5, workers=1)
    two = _pretrain(tmp_path / "two", tokenizer, seed=5, workers=2)
    assert one == two


def test_sft_cache_is_byte_identical_for_same_input_and_seed(tmp_path, tokenizer):
    for name in ("a", "b"):
        build_sft_cache(iter(CONVS), str(tmp_path / name / "sft"), tokenizer=tokenizer, val_frac=0.2, seed=11)
    a, b = _digests(tmp_path / "a" / "sft"), _digests(tmp_path / "b" / "sft")
    assert a == b and set(a) == {"meta.json", "train_tokens.bin", "train_idx.npy", "val_tokens.bin", "val_idx.npy"}
    build_sft_cache(iter(CONVS), str(tmp_path / "c" / "sft"), tokenizer=tokenizer, val_frac=0.2, seed=12)
    assert _digests(tmp_path / "c" / "sft")["val_idx.npy"] != a["val_idx.npy"]


def test_own_split_with_shuffle_is_identical_for_1_and_2_workers(tmp_path, tokenizer):
    from niels_gpt.builders.pretrain import SplitTexts

    digests = []
    for workers in (1, 2):
        out = tmp_path / str(workers) / "cache"
        build_pretrain_cache(SplitTexts(train=iter(TEXTS[:250]), val=iter(TEXTS[250:])), str(out), tokenizer=tokenizer,
                             max_train_tokens=2500, max_val_tokens=400, shard_bytes=700, seed=3, shuffle_buffer=16,
                             num_workers=workers)
        digests.append(_digests(out))
    assert digests[0] == digests[1]


def test_skipped_counts_do_not_depend_on_read_ahead(tmp_path, tokenizer):
    # Empty documents after the point where the budgets are met: a pool that reads ahead sees them,
    # but meta.json only counts what the build consumed.
    texts = TEXTS[:40] + ["", " "] * 2000
    metas = []
    for workers in (1, 2):
        out = tmp_path / str(workers) / "cache"
        build_pretrain_cache(iter(texts), str(out), tokenizer=tokenizer, max_train_tokens=300, max_val_tokens=100,
                             shard_bytes=1000, seed=0, shuffle_buffer=None, num_workers=workers)
        metas.append((out / "meta.json").read_bytes())
    assert metas[0] == metas[1]


def test_native_and_python_id_conversion_write_identical_caches(tmp_path, tokenizer, monkeypatch):
    import pytest

    from niels_gpt import _native

    if _native.gather is None:
        pytest.skip(f"native kernel not built: {_native.UNAVAILABLE}")
    native = _pretrain(tmp_path / "native", tokenizer, seed=5)  # budgets cut a document in each split
    monkeypatch.setattr(_native, "gather", None)
    python = _pretrain(tmp_path / "python", tokenizer, seed=5)
    assert native == python
