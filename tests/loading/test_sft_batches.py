"""A DataLoader batch of SFTExampleDataset is one gather (`__getitems__`) that default_collate passes through:
the same [x, y, y_masked] as collating the items one by one, without stacking B rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from niels_gpt.errors import ConfigError
from niels_gpt.meta import file_record, write_meta
from niels_gpt.readers.sft import SFTExampleDataset

from ..conftest import write_sft_cache

# the library's sentinels in conftest: usr 4, asst 5, eot 6
EXAMPLES = [[4, 10 + i, 5, *range(20, 20 + i % 9), 6] for i in range(23)]


@pytest.fixture
def ds(tmp_path):
    out = write_sft_cache(tmp_path / "sft", EXAMPLES)
    return SFTExampleDataset(str(out / "train_tokens.bin"), str(out / "train_idx.npy"), T=6, device="cpu", eot_id=6)


def test_a_batch_is_one_gather_equal_to_its_items_collated(ds, monkeypatch):
    gathers = []
    real = ds._rows_tensor
    monkeypatch.setattr(ds, "_rows_tensor", lambda idx, pin=False: (gathers.append(len(idx)), real(idx, pin))[1])
    for workers in (0, 2):
        order = [[3, 1, 22, 0, 7], [5, 5, 2, 19, 8], [11, 4, 6, 9, 10], [12, 13, 21, 14, 15], [16, 17, 18]]
        loader = DataLoader(ds, batch_sampler=order, num_workers=workers)
        for batch, indices in zip(loader, order, strict=True):
            expected = default_collate([tuple(t.clone() for t in real(np.array([i]))[:, 0]) for i in indices])
            assert type(batch) is type(expected) is list and len(batch) == 3
            for got, want in zip(batch, expected, strict=True):
                assert got.dtype == torch.int64 and got.shape == want.shape and torch.equal(got, want)
    assert gathers[:5] == [5, 5, 5, 5, 3]  # one gather a batch (workers gather in their own processes)


def test_a_batch_of_bad_indices_is_refused_as_an_item_would_be(ds):
    with pytest.raises(IndexError, match="example 23 is out of range for 23 examples"):
        ds.__getitems__([0, 23])
    with pytest.raises(TypeError, match="indices are integers"):
        ds.__getitems__([0, 1.5])
    assert torch.equal(default_collate(ds.__getitems__([-1, 0]))[0][0], ds[22][0])


def _counting_getitems(monkeypatch) -> list[list[int]]:
    """Record the index lists DataLoader hands SFTExampleDataset.__getitems__ (in this process)."""
    calls, real = [], SFTExampleDataset.__getitems__
    monkeypatch.setattr(SFTExampleDataset, "__getitems__", lambda self, idx: (calls.append(list(idx)), real(self, idx))[1])
    return calls


def test_a_loader_with_batch_size_asks_for_each_batch_at_once_and_equals_the_items(ds, monkeypatch):
    calls = _counting_getitems(monkeypatch)
    g = torch.Generator().manual_seed(5)
    batches = list(DataLoader(ds, batch_size=4, shuffle=True, generator=g))
    assert [len(c) for c in calls] == [4] * 5 + [3] and sorted(sum(calls, [])) == list(range(23))
    for batch, indices in zip(batches, calls, strict=True):
        expected = default_collate([ds[i] for i in indices])  # the per-item path, collated row by row
        assert len(batch) == 3
        for got, want in zip(batch, expected, strict=True):
            assert got.dtype == torch.int64 and got.shape == (len(indices), 6) and torch.equal(got, want)


def test_a_stored_mask_batch_equals_its_items(tmp_path):
    """A cache rendered by a chat template: its mask is read from train_mask.bin, a batch at once as the
    tokens are, including examples that end within T+1 tokens of the end of the file."""
    cache = write_sft_cache(tmp_path / "c", EXAMPLES)
    meta = json.loads((cache / "meta.json").read_text())
    meta["special_token_ids"]["asst"] = None
    n = sum(len(e) for e in EXAMPLES)
    mask = np.random.default_rng(0).integers(0, 2, n).astype(np.uint8)  # unlike any span rule: a wrong row shows
    mask.tofile(cache / "train_mask.bin")
    meta["files"]["train_mask.bin"] = file_record(cache / "train_mask.bin", None)
    write_meta(str(cache), meta)
    T = 10  # the last example (8 tokens) starts within T+1 tokens of the end of the file
    ds = SFTExampleDataset(str(cache / "train_tokens.bin"), str(cache / "train_idx.npy"), T=T, device="cpu",
                           eot_id=6)
    indices = [22, 0, 21, 5, 22, 13]
    batch = default_collate(ds.__getitems__(indices))
    items = default_collate([ds[i] for i in indices])
    for got, want in zip(batch, items, strict=True):
        assert torch.equal(got, want)
    starts = np.concatenate([[0], np.cumsum([len(e) for e in EXAMPLES])])
    for row, i in enumerate(indices):
        k = min(len(EXAMPLES[i]), T + 1) - 1  # targets of the example's own tokens
        own = mask[starts[i] + 1:starts[i] + 1 + k].astype(bool)
        assert batch[0][row, :k].tolist() == EXAMPLES[i][:k]
        y = batch[1][row, :k].numpy()
        assert batch[2][row, :k].tolist() == np.where(own, y, -100).tolist()
        assert (batch[2][row, k:] == -100).all()


def test_collate_refuses_a_bad_index_as_an_item_would_be(ds):
    """collate(indices) indexed the offsets with whatever it was given: 23 of 23 examples failed inside numpy naming no
    file, 1.5 failed as a non-integer array index. It checks them as ds[i] does, and reads what ds[i] reads."""
    with pytest.raises(IndexError, match="example 23 is out of range for 23 examples in .*train_idx.npy"):
        ds.collate([0, 23])
    with pytest.raises(TypeError, match="indices are integers"):
        ds.collate(np.array([0.0, 1.5]))
    x, y, y_masked = ds.collate(np.array([3, -1]))
    for row, i in enumerate([3, 22]):
        assert all(torch.equal(a[row], b) for a, b in zip((x, y, y_masked), ds[i], strict=True))


def test_the_offsets_of_another_split_or_cache_are_refused(tmp_path):
    """train_tokens.bin with val_idx.npy opened, and read train tokens at val's offsets: other examples, silently. The
    offsets must be the tokens' own split's, from the same directory; a missing one is named, not a FileNotFoundError."""
    cache = write_sft_cache(tmp_path / "c", EXAMPLES, EXAMPLES[:3])
    for tokens, idx in ((cache / "train_tokens.bin", cache / "val_idx.npy"),
                        (cache / "train_tokens.bin", tmp_path / "train_idx.npy"),
                        (cache / "train_idx.npy", cache / "train_tokens.bin")):
        with pytest.raises(ConfigError, match="not the tokens and offsets of one split of one cache; pass the tokens"):
            SFTExampleDataset(str(tokens), str(idx), T=8, device="cpu", eot_id=6)
    ds = SFTExampleDataset(str(cache / "val_tokens.bin"), str(tmp_path / "c" / "." / "val_idx.npy"), T=8, device="cpu",
                           eot_id=6)
    assert len(ds) == 3
