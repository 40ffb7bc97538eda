"""Reader, multi-shard dataset, varlen collate, and DataLoader workers."""

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from niels_gpt.packing import (
    PackedMemmapDataset,
    PackedMultiShardDataset,
    collate_packed,
    open_packed,
    pack_sft,
)
from niels_gpt.packing.memmap_format import MemmapShardWriter

from ..conftest import write_sft_cache
from .helpers import chats


def _numbered_shard(path, num_bins=100, pack_size=64, first=0):
    """Bins of 50 tokens, two sequences each; token 0 of bin b is first + b."""
    with MemmapShardWriter(path, num_bins, pack_size, 2 * num_bins) as w:
        for b in range(num_bins):
            ids = np.arange(50, dtype=np.int32) + 1000
            ids[0] = first + b
            w.write_bin(ids, np.ones(50, np.uint8) * (np.arange(50) % 25 != 24), [0, 25])
        w.finalize()
    return path


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
def test_dataloader_with_4_persistent_workers_reads_every_bin_once(tmp_path):
    ds = PackedMemmapDataset(_numbered_shard(tmp_path / "s"))
    loader = DataLoader(ds, batch_size=8, num_workers=4, persistent_workers=True, collate_fn=collate_packed)
    seen = []
    for _ in range(2):  # a second epoch reuses the persistent workers
        epoch = []
        for batch in loader:
            assert batch["input_ids"].shape[1] == 50
            epoch += batch["input_ids"][:, 0].tolist()
        seen.append(sorted(epoch))
    assert seen[0] == seen[1] == list(range(100))


def test_pickles_as_paths_not_memmaps(tmp_path):
    ds = PackedMemmapDataset(_numbered_shard(tmp_path / "s", num_bins=2000))
    ds[5]  # opens the memmaps in this process
    blob = pickle.dumps(ds)
    assert len(blob) < 10_000  # input_ids alone is 2000 * 64 * 4 bytes
    clone = pickle.loads(blob)
    assert clone[5]["input_ids"][0] == 5 and clone._arrays is not None


def test_item_is_a_copy_with_boundaries(tmp_path):
    ds = PackedMemmapDataset(_numbered_shard(tmp_path / "s", num_bins=3))
    it = ds[-1]
    assert it["input_ids"][0] == 2 and it["seq_boundaries"].tolist() == [0, 25, 50]
    assert it["input_ids"].flags.writeable and it["loss_mask"].dtype == np.uint8
    with pytest.raises(IndexError, match="index 3 out of range for 3 bins"):
        ds[3]


def test_multi_shard_concatenates_in_order(tmp_path):
    a = _numbered_shard(tmp_path / "a", num_bins=3, first=0)
    b = _numbered_shard(tmp_path / "b", num_bins=5, first=100)
    c = _numbered_shard(tmp_path / "c", num_bins=2, first=200)
    ds = PackedMultiShardDataset([a, b, c])
    assert len(ds) == 10 and ds.offsets.tolist() == [0, 3, 8, 10]
    assert [ds[i]["input_ids"][0] for i in range(10)] == [0, 1, 2, 100, 101, 102, 103, 104, 200, 201]
    assert ds[-1]["input_ids"][0] == 201
    with pytest.raises(IndexError, match="index 10 out of range"):
        ds[10]
    assert len(open_packed([a, c])) == 5


def test_collate_builds_varlen_fields():
    one = {"input_ids": np.array([10, 11, 12, 20, 21], np.int32),
           "loss_mask": np.array([1, 1, 0, 1, 0], np.uint8), "seq_boundaries": np.array([0, 3, 5])}
    two = {"input_ids": np.array([30, 31, 32], np.int32),
           "loss_mask": np.array([0, 1, 0], np.uint8), "seq_boundaries": np.array([0, 3])}
    b = collate_packed([one, two])
    assert b["input_ids"].tolist() == [[10, 11, 12, 20, 21], [30, 31, 32, 0, 0]]
    assert b["labels"].tolist() == [[11, 12, -100, 21, -100], [-100, 32, -100, -100, -100]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 0, 1]]
    assert b["cu_seqlens"].dtype == torch.int32 and b["cu_seqlens"].tolist() == [0, 3, 5, 8, 10]
    assert b["max_seqlen"] == 3
    assert b["loss_mask"].tolist() == [[True, True, False, True, False], [False, True, False, False, False]]
    padded = collate_packed([two], pad_to=8, pad_id=-1)
    assert padded["input_ids"].tolist() == [[30, 31, 32, -1, -1, -1, -1, -1]]
    assert padded["cu_seqlens"].tolist() == [0, 3, 8] and padded["max_seqlen"] == 5


def test_collate_labels_never_cross_a_sequence_boundary(tmp_path):
    write_sft_cache(tmp_path / "c", chats(80, seed=3))
    pack_sft(tmp_path / "c", tmp_path / "p", pack_size=192)
    ds = PackedMemmapDataset(tmp_path / "p")
    batch = collate_packed([ds[i] for i in range(len(ds))])
    cu = batch["cu_seqlens"].tolist()
    flat_labels = batch["labels"].reshape(-1)
    last_positions = [c - 1 for c in cu[1:]]
    assert (flat_labels[last_positions] == -100).all()
    # labels are exactly the next token wherever they are set
    ids = batch["input_ids"]
    set_ = batch["labels"] != -100
    assert torch.equal(batch["labels"][:, :-1][set_[:, :-1]], ids[:, 1:][set_[:, :-1]])
    assert int(set_.sum()) == int(batch["loss_mask"].sum())


def test_collate_rejects_a_bin_longer_than_pad_to():
    from niels_gpt.errors import FormatError

    item = {"input_ids": np.arange(5), "loss_mask": np.zeros(5), "seq_boundaries": np.array([0, 5])}
    with pytest.raises(FormatError, match="a bin of 5 tokens does not fit pad_to=4"):
        collate_packed([item], pad_to=4)


def test_collate_never_labels_across_a_boundary_even_where_a_foreign_bin_masks_a_sequence_end():
    """Packed Parquet and legacy bins are read as written: a loss mask of 1 at a sequence's last position (an
    unshifted mask) made that position's label the next sequence's first token. Collate clears the mask there, so
    labels and loss_mask agree and no label crosses a boundary."""
    item = {"input_ids": np.array([10, 11, 12, 20, 21], np.int32),
            "loss_mask": np.array([0, 1, 1, 0, 1], np.uint8), "seq_boundaries": np.array([0, 3, 5])}
    b = collate_packed([item])
    assert b["labels"].tolist() == [[-100, 12, -100, -100, -100]]
    assert b["loss_mask"].tolist() == [[False, True, False, False, False]]
    assert item["loss_mask"].tolist() == [0, 1, 1, 0, 1]  # the item itself is left as it was


@pytest.mark.parametrize("bad", [1.5, "1", True])
def test_a_bin_index_that_is_not_an_integer_is_refused_not_cut(tmp_path, bad):
    """ds[1.5] and ds["1"] read bin 1 (int() cut and parsed them); every packed dataset refuses them, as the window and
    SFT datasets do, and takes any integer (numpy, a 0-d tensor)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from niels_gpt.packing import PackedParquetDataset

    shard = _numbered_shard(tmp_path / "s", num_bins=3)
    pq.write_table(pa.table({"input_ids": [[1, 2]] * 3, "loss_mask": [[1, 0]] * 3, "seq_start_id": [[0]] * 3}),
                   tmp_path / "p.parquet")
    for ds in (PackedMemmapDataset(shard), PackedMultiShardDataset([shard]), PackedParquetDataset(tmp_path / "p.parquet")):
        with pytest.raises(TypeError, match="bin indices are integers, got"):
            ds[bad]
        assert ds[np.int64(1)]["input_ids"].tolist() == ds[torch.tensor(1)]["input_ids"].tolist() == ds[1]["input_ids"].tolist()


def test_a_shard_replaced_after_the_dataset_was_opened_is_refused_not_read(tmp_path):
    """The arrays are mapped again in each process that reads (DataLoader workers: every epoch without persistent
    ones). A shard packed again into the same directory after the dataset was opened was read with the old
    manifest's bin count: other bins, silently. The files must be the ones checked on open."""
    from niels_gpt.errors import CacheMismatchError

    write_sft_cache(tmp_path / "c", chats(40, seed=2))
    pack_sft(tmp_path / "c", tmp_path / "p", pack_size=96, warn=False)
    ds = PackedMemmapDataset(tmp_path / "p")
    copy = pickle.loads(pickle.dumps(ds))  # what a worker process gets
    pack_sft(tmp_path / "c", tmp_path / "p", pack_size=192, warn=False)  # packed again, in place
    for d in (ds, copy):
        with pytest.raises(CacheMismatchError, match=r"p: its arrays were replaced since the dataset was opened \(packed again\?\)"):
            d[0]
    assert len(PackedMemmapDataset(tmp_path / "p")[0]["input_ids"]) > 96  # opened again: the new bins
