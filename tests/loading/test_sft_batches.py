"""A DataLoader batch of SFTExampleDataset is one gather (`__getitems__`) that default_collate passes through:
the same [x, y, y_masked] as collating the items one by one, without stacking B rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

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
