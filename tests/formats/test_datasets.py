"""The peers' dataset semantics: KempnerForge map-style windows and packing, nanoGPT iterable splits."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest
import torch

from niels_gpt.errors import ConfigError, StateError
from niels_gpt.formats.convert import convert
from niels_gpt.formats.kempner_dataset import MemoryMappedDataset
from niels_gpt.formats.nanogpt_dataset import NanogptDataset

EOT = 6


def _npy_dir(path, arrays):
    path.mkdir()
    for i, a in enumerate(arrays):
        np.save(path / f"shard_{i:05d}.npy", np.asarray(a, dtype="<u2"))
    return path


def test_pack_sequences_labels_and_doc_ids_exact(tmp_path):
    d = _npy_dir(tmp_path / "d", [[10, 11, EOT, 12, EOT, EOT, 13, 14, 15]])
    ds = MemoryMappedDataset(d, seq_len=8, pack_sequences=True, eos_token_id=EOT)
    s = ds[0]
    assert s["input_ids"].tolist() == [10, 11, EOT, 12, EOT, EOT, 13, 14]
    assert s["labels"].tolist() == [11, EOT, -100, EOT, -100, -100, 14, 15]
    assert s["doc_ids"].tolist() == [0, 0, 0, 1, 1, 2, 3, 3]
    assert s["input_ids"].dtype == torch.int64
    plain = MemoryMappedDataset(d, seq_len=8)[0]
    assert set(plain) == {"input_ids", "labels"} and plain["labels"].tolist() == [11, EOT, 12, EOT, EOT, 13, 14, 15]


def test_windows_per_file_and_binary_search_across_files(tmp_path):
    d = _npy_dir(tmp_path / "d", [list(range(100, 107)), list(range(200, 203)), list(range(300, 309))])
    ds = MemoryMappedDataset(d, seq_len=2)  # windows of 3: files give 2, 1, 3 samples
    assert len(ds) == 6
    firsts = [ds[i]["input_ids"][0].item() for i in range(6)]
    assert firsts == [100, 103, 200, 300, 303, 306]
    assert ds[-1]["labels"].tolist() == [307, 308]
    with pytest.raises(IndexError, match="sample 6 out of range for 6 samples"):
        ds[6]


def test_kempner_dataset_reads_our_cache_and_its_eot(small_cache):
    ds = MemoryMappedDataset(small_cache / "train", seq_len=3, pack_sequences=True)
    assert ds.eos_token_id == EOT and len(ds) == 2
    assert ds[1]["doc_ids"].tolist() == [0, 1, 2] and ds[1]["labels"].tolist() == [-100, -100, EOT]
    with pytest.raises(ConfigError, match="pack_sequences needs the EOS id"):
        MemoryMappedDataset(_npy_dir(small_cache.parent / "n", [[1, 2]]), seq_len=1, pack_sequences=True)


def test_kempner_state_dict_round_trip_and_mismatch(tmp_path):
    d = _npy_dir(tmp_path / "d", [list(range(20))])
    ds = MemoryMappedDataset(d, seq_len=4)
    ds.set_epoch(3)
    other = MemoryMappedDataset(d, seq_len=4)
    other.load_state_dict(ds.state_dict())
    assert other.epoch == 3 and ds.state_dict()["total_samples"] == 4
    with pytest.raises(StateError, match="seq_len=4 but this dataset has 5"):
        MemoryMappedDataset(d, seq_len=5).load_state_dict(ds.state_dict())
    assert pickle.loads(pickle.dumps(ds))[2]["input_ids"].tolist() == [10, 11, 12, 13]


def _samples(ds) -> list[tuple[int, ...]]:
    return [tuple(s["input_ids"].tolist() + s["labels"][-1:].tolist()) for s in ds]


@pytest.mark.parametrize("n_files, align", [(1, False), (3, False), (17, False), (2, True), (9, True)])
def test_rank_and_worker_splits_are_disjoint_and_complete(tmp_path, n_files, align):
    rng = torch.Generator().manual_seed(n_files)
    arrays = [torch.randint(7, 60000, (int(torch.randint(30, 90, (1,), generator=rng)),), generator=rng).tolist()
              for _ in range(n_files)]
    for a in arrays:  # BOS tokens scattered through every file, unique token values make samples unique
        for j in range(0, len(a), 7):
            a[j] = 1
    paths = []
    for i, a in enumerate(arrays):
        a = np.asarray(a, dtype="<u2")
        a[a != 1] = np.arange(1000 * i + 2, 1000 * i + 2 + int((a != 1).sum()))
        p = tmp_path / f"f{i:03d}.npy"
        np.save(p, a)
        paths.append(str(p))
    kw = dict(seq_len=5, bos_token=1, align_to_bos=align, shuffle_files=True, seed=3)
    single = _samples(NanogptDataset(paths, **kw))
    assert len(single) == len(set(single)) > 0
    for world, workers in itertools.product(range(1, 5), range(1, 5)):
        seen = []
        for rank in range(world):
            ds = NanogptDataset(paths, rank=rank, world_size=world, **kw)
            for w in range(workers):
                seen.extend(_samples_for_worker(ds, w, workers))
        assert sorted(seen) == sorted(single), (world, workers)
        if align:
            assert all(s[0] == 1 for s in seen)


def _samples_for_worker(ds, worker, workers):
    consumer, consumers = ds._rank * workers + worker, ds._world * workers
    out = []
    for f, a, b in ds.plan(consumer, consumers, ds.epoch):
        tokens = ds.files[f].open()
        for s in ds._file_starts(f)[a:b].tolist():
            w = np.asarray(tokens[s:s + ds.seq_len + 1]).tolist()
            out.append(tuple(w))
    return out


def test_single_file_is_split_by_token_ranges_not_duplicated(tmp_path):
    np.save(tmp_path / "one.npy", np.arange(2, 202, dtype="<u2"))
    per_rank = [_samples(NanogptDataset([str(tmp_path / "one.npy")], 9, rank=r, world_size=4)) for r in range(4)]
    assert [len(p) for p in per_rank] == [5, 5, 5, 5]  # 20 windows of 10 tokens (stride 10), no copies
    assert per_rank[1][0][0] == 2 + 5 * 10


def test_dataloader_workers_split_one_file(tmp_path):
    np.save(tmp_path / "one.npy", np.arange(2, 402, dtype="<u2"))
    ds = NanogptDataset([str(tmp_path / "one.npy")], 9)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    got = sorted(int(s["input_ids"][0]) for s in loader)
    assert got == [2 + 10 * i for i in range(40)]


def test_bos_alignment_uses_the_sidecar_and_starts_every_sample_on_bos(small_cache, tmp_path):
    convert(small_cache, tmp_path / "n", to="nanogpt", bos_index=True)
    ds = NanogptDataset(str(tmp_path / "n" / "train"), 2, align_to_bos=True)
    assert ds.bos_token == EOT
    assert _samples(ds) == [(EOT, 10, 11), (EOT, 13, 14), (EOT, EOT, 15)]
    with pytest.raises(ConfigError, match="align_to_bos=True needs bos_token"):
        NanogptDataset(str(_npy_dir(tmp_path / "plain", [[1, 2, 3]])), 2, align_to_bos=True)


def test_nanogpt_dataset_reads_our_cache_with_stride_seq_len_plus_one(small_cache):
    ds = NanogptDataset(str(small_cache / "train"), 3)
    assert [s["input_ids"].tolist() for s in ds] == [[10, 11, 12], [EOT, EOT, 15]]  # windows stay in a file
    ds = NanogptDataset(str(small_cache / "train"), 1)
    assert [s["input_ids"].tolist() + s["labels"].tolist() for s in ds] == [
        [10, 11], [12, EOT], [13, 14], [EOT, EOT], [15, EOT]]


def test_resume_continues_where_the_consumer_stopped(tmp_path):
    paths = []
    for i in range(3):
        np.save(tmp_path / f"f{i}.npy", np.arange(100 * i + 2, 100 * i + 40, dtype="<u2"))
        paths.append(str(tmp_path / f"f{i}.npy"))
    full = _samples(NanogptDataset(paths, 4, shuffle_files=True, seed=5))
    assert _samples(NanogptDataset(str(tmp_path / "f*.npy"), 4, shuffle_files=True, seed=5)) == full
    ds = NanogptDataset(paths, 4, shuffle_files=True, seed=5)
    it = iter(ds)
    head = [next(it) for _ in range(11)]
    state = ds.state_dict()
    assert state["consumed"] == {"0": 11} and state["epoch"] == 0
    fresh = NanogptDataset(paths, 4, shuffle_files=True, seed=5)
    fresh.load_state_dict(state)
    rest = _samples(fresh)
    assert [tuple(s["input_ids"].tolist() + s["labels"][-1:].tolist()) for s in head] + rest == full
    assert fresh.epoch == 1 and _samples(fresh) != full  # next pass: epoch 1, files reshuffled
    with pytest.raises(StateError, match="seq_len=4 but this dataset has 3"):
        NanogptDataset(paths, 3).load_state_dict(state)
