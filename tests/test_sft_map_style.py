"""SFTExampleDataset is a map-style dataset: ds[i] is example i padded or cropped to T with its mask, the
same row `collate` builds, and a DataLoader (workers included) batches it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from niels_gpt.readers.sft import SFTExampleDataset

from .conftest import write_sft_cache

# the library's sentinels in conftest: usr 4, asst 5, eot 6
EXAMPLES = [[4, 10, 11, 5, 20, 21, 22, 6], [4, 12, 5, 23, 6], [4, 13, 14, 15, 16, 5, 24, 25, 26, 27, 28, 6]]


@pytest.fixture
def ds(tmp_path):
    out = write_sft_cache(tmp_path / "sft", EXAMPLES)
    return SFTExampleDataset(str(out / "train_tokens.bin"), str(out / "train_idx.npy"), T=8, device="cpu", eot_id=6)


def test_an_item_is_one_example_padded_or_cropped_to_T_with_its_mask(ds):
    x, y, ym = ds[1]  # 5 tokens: padded with EOT, padding never a target
    assert x.tolist() == [4, 12, 5, 23, 6, 6, 6, 6] and y.tolist() == [12, 5, 23, 6, 6, 6, 6, 6]
    assert ym.tolist() == [-100, -100, 23, 6, -100, -100, -100, -100]
    x, y, ym = ds[-1]  # 12 tokens: cropped to its first T+1
    assert x.tolist() == EXAMPLES[2][:8] and y.tolist() == EXAMPLES[2][1:9]
    assert ym.tolist() == [-100] * 5 + [24, 25, 26]
    assert all(t.dtype == torch.int64 and t.shape == (8,) for t in ds[0])
    for i in range(len(ds)):
        assert all(torch.equal(a, b[0]) for a, b in zip(ds[i], ds.collate(np.array([i])), strict=True))
    with pytest.raises(IndexError, match=r"example 3 is out of range for 3 examples"):
        ds[3]


def test_a_dataloader_batches_it_with_workers(ds):
    batches = list(DataLoader(ds, batch_size=2, num_workers=2))
    assert [b[0].shape for b in batches] == [(2, 8), (1, 8)]
    x, y, ym = (torch.cat(parts) for parts in zip(*batches, strict=True))
    want = ds.collate(np.arange(3))
    assert torch.equal(x, want[0]) and torch.equal(y, want[1]) and torch.equal(ym, want[2])
