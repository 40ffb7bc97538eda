"""Contract acceptance test 3: write a small SFT cache, read it back, compare with the tokenizer."""

import numpy as np
import pytest
import torch

from niels_gpt.cache.build_cache import build_sft_cache
from niels_gpt.cache.meta import read_meta
from niels_gpt.cache.sft_dataset import SFTExampleDataset
from niels_gpt.errors import CacheError, ConfigError

from .conftest import write_sft_cache

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime."},
     {"role": "assistant", "content": "Seven."}, {"role": "user", "content": "Another."},
     {"role": "assistant", "content": "Eleven."}],
    [{"role": "user", "content": "No answer here."}],  # skipped: no assistant turn
    [],  # skipped: empty
    [{"role": "user", "content": "Write a line of verse."},
     {"role": "assistant", "content": "The sea is calm tonight, the tide is full."}],
] + [[{"role": "user", "content": f"Count to {i}."},
      {"role": "assistant", "content": " ".join(str(k) for k in range(1, i + 1))}] for i in range(1, 30)]


@pytest.fixture(scope="module")
def sft_cache(tmp_path_factory, tokenizer):
    out = tmp_path_factory.mktemp("sft") / "toy"
    build_sft_cache(CONVERSATIONS, str(out), tokenizer=tokenizer, val_frac=0.25, seed=3)
    return out


def _examples(out, split):
    tokens = np.fromfile(out / f"{split}_tokens.bin", dtype="<u2")
    idx = np.load(out / f"{split}_idx.npy", allow_pickle=False)
    ends = np.append(idx[1:], len(tokens))
    return tokens, idx, [tokens[a:b].tolist() for a, b in zip(idx, ends, strict=True)]


def test_tokens_parse_as_uint16_and_offsets_are_valid(sft_cache):
    for split in ("train", "val"):
        tokens, idx, _ = _examples(sft_cache, split)
        assert (sft_cache / f"{split}_tokens.bin").stat().st_size == 2 * len(tokens)
        assert idx.dtype == np.int64 and idx[0] == 0
        assert (np.diff(idx) > 0).all() and idx[-1] < len(tokens)


def test_reconstructed_sequences_match_the_tokenization(sft_cache, tokenizer):
    usable = [c for c in CONVERSATIONS if any(m["role"] == "assistant" for m in c)]
    expected = [tokenizer.render_chat(c).ids for c in usable]
    got = _examples(sft_cache, "train")[2] + _examples(sft_cache, "val")[2]
    assert sorted(got) == sorted(expected)
    # Within a split, the stream order is kept.
    train = _examples(sft_cache, "train")[2]
    assert train == [e for e in expected if e in train]


def test_meta_counts_examples_and_skips(sft_cache):
    meta = read_meta(str(sft_cache))
    t = meta["totals"]
    assert t["train_examples"] + t["val_examples"] == len(CONVERSATIONS) - 2
    assert t["val_examples"] > 0 and t["train_examples"] > t["val_examples"]
    assert meta["skipped"] == {"empty_conversation": 1, "no_assistant_turn": 1}
    assert meta["token_dtype"] == "uint16-le" and meta["kind"] == "sft"
    assert set(meta["special_token_ids"]) == {"sys", "usr", "asst", "eot"}


def test_dataset_rows_longer_and_shorter_than_T_plus_1(sft_cache, tokenizer):
    _, _, examples = _examples(sft_cache, "train")
    T = sorted(len(e) for e in examples)[len(examples) // 2]  # about half the examples are longer than T+1
    ds = SFTExampleDataset(str(sft_cache / "train_tokens.bin"), str(sft_cache / "train_idx.npy"), T=T,
                           device="cpu", eot_id=tokenizer.eot_id)
    x, y, ym = ds.collate(np.arange(len(ds)))
    for i, ex in enumerate(examples):
        row = (ex + [tokenizer.eot_id] * (T + 1))[:T + 1]
        assert x[i].tolist() == row[:-1] and y[i].tolist() == row[1:]
    assert any(len(e) > T + 1 for e in examples) and any(len(e) < T + 1 for e in examples)
    assert ((ym == -100) | (ym == y)).all()


def test_unknown_role_names_the_example(tmp_path, tokenizer):
    bad = [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
           [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "b"}]]
    with pytest.raises(ConfigError, match=r"example 1: message 0: unknown role 'robot'"):
        build_sft_cache(bad, str(tmp_path / "s"), tokenizer=tokenizer, val_frac=0.1, seed=0)
    assert not (tmp_path / "s" / "meta.json").exists()
    assert not list((tmp_path / "s").glob("*.tmp-*"))


def test_no_usable_example_is_an_error(tmp_path, tokenizer):
    with pytest.raises(ConfigError, match="no usable conversation"):
        build_sft_cache([[{"role": "user", "content": "q"}]], str(tmp_path / "s"), tokenizer=tokenizer,
                        val_frac=0.1, seed=0)
    assert not (tmp_path / "s" / "meta.json").exists()


def test_rejects_val_frac_out_of_range(tmp_path, tokenizer):
    with pytest.raises(ConfigError, match=r"val_frac must be in \[0, 1\)"):
        build_sft_cache(CONVERSATIONS, str(tmp_path / "s"), tokenizer=tokenizer, val_frac=1.5, seed=0)


def test_offsets_that_do_not_increase_are_rejected(tmp_path):
    out = write_sft_cache(tmp_path / "s", [[4, 1, 6, 5, 2, 6], [4, 1, 6, 5, 2, 6]])
    np.save(out / "train_idx.npy", np.array([0, 0], dtype="<i8"))
    # Keep meta's size in step so the offsets check itself is what fires.
    from niels_gpt.cache.meta import file_record, read_meta, write_meta
    meta = read_meta(str(out))
    meta["files"]["train_idx.npy"] = {**file_record(out / "train_idx.npy", None), "examples": 2}
    write_meta(str(out), meta)
    with pytest.raises(CacheError, match="offset 1 .* does not increase"):
        SFTExampleDataset(str(out / "train_tokens.bin"), str(out / "train_idx.npy"), T=4, device="cpu", eot_id=6)


def test_get_batch_is_deterministic_for_a_seed(sft_cache, tokenizer):
    ds = SFTExampleDataset(str(sft_cache / "train_tokens.bin"), str(sft_cache / "train_idx.npy"), T=16,
                           device="cpu", eot_id=tokenizer.eot_id)
    a = ds.get_batch(B=5, generator=torch.Generator().manual_seed(9))
    b = ds.get_batch(B=5, generator=torch.Generator().manual_seed(9))
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))


def test_a_message_holding_a_lone_surrogate_is_refused_by_name(tokenizer, tmp_path):
    """Text that is not text (a lone surrogate, possible only through the Python API: the readers refuse it) is
    refused naming the example, the message and the character, and nothing is left at the output; sentencepiece
    itself would raise a bare RuntimeError."""
    bad = [{"role": "user", "content": "Is this fine?"}, {"role": "assistant", "content": "Yes \ud83d no"}]
    with pytest.raises(ConfigError, match=r"example 2: message 1 \(assistant\): content holds a lone surrogate "
                                          r"'\\ud83d' at character 4"):
        build_sft_cache(CONVERSATIONS[:2] + [bad], str(tmp_path / "c"), tokenizer=tokenizer, val_frac=0.0, seed=1)
    assert not (tmp_path / "c").exists()
