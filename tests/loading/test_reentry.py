"""Every resumable loader, stream and sampler: a loop that leaves after `break` and comes back gets the next
undelivered batch, and state_dict() counts only the batches delivered."""

from __future__ import annotations

from itertools import islice

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from niels_gpt.loading import (
    MixtureDataset,
    MixtureSampler,
    ParquetTokenLoader,
    RankBatchStream,
    list_parquet_files,
)
from niels_gpt.loading.sampler import GlobalBatchSampler, ResumableDataLoader
from niels_gpt.loading.shard_windows import ShardWindowSampler
from niels_gpt.packing import collate_packed, open_packed
from niels_gpt.packing.memmap_format import MemmapShardWriter
from niels_gpt.resume import fingerprint


class Ids(Dataset):
    """ds[i] = i, named by its size."""

    def __init__(self, n, base=0):
        self.n, self.base = n, base

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor(self.base + i)

    def fingerprint(self):
        return fingerprint("ids", self.n, self.base)


class ShardIds(Ids):
    def shard_counts(self):
        return [20] * (self.n // 20)


class Draws:
    """get_batch draws B ids from the generator: a random-window dataset in miniature."""

    def get_batch(self, B, generator):
        return torch.randint(0, 1000, (B,), generator=generator)

    def fingerprint(self):
        return "draws"


def packed_dir(path):
    with MemmapShardWriter(path, 64, 8, 64) as w:
        for b in range(64):
            w.write_bin(np.arange(b, b + 8, dtype=np.int32), np.array([0, 1, 1, 1, 1, 1, 1, 0], np.uint8), [0])
        w.finalize()
    return path


def mixture():
    return MixtureDataset({"a": Ids(200), "b": Ids(50, 10_000)})


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return packed_dir(tmp_path_factory.mktemp("packed") / "bins")


def _makers(parquet_dir, tokenizer, packed):
    files = list_parquet_files(parquet_dir) if parquet_dir else None

    def loader(ds, sampler, **kw):
        return lambda: ResumableDataLoader(ds, sampler(ds), **kw)

    return {
        "global-sampler": lambda: GlobalBatchSampler(Ids(200), 8, seed=1, rank=0, world_size=1),
        "global-sampler-rank1": lambda: GlobalBatchSampler(Ids(200), 8, seed=1, rank=1, world_size=2),
        "shard-window-sampler": lambda: ShardWindowSampler(ShardIds(200), 8, seed=1, shards_at_once=3,
                                                           rank=0, world_size=1),
        "loader-0-workers": loader(Ids(200), lambda ds: GlobalBatchSampler(ds, 8, seed=1, rank=0, world_size=1)),
        "loader-0-workers-inline": loader(Ids(200), lambda ds: GlobalBatchSampler(ds, 8, seed=1, rank=0,
                                                                                  world_size=1), assemble_ahead=0),
        "loader-2-workers": loader(Ids(200), lambda ds: GlobalBatchSampler(ds, 8, seed=1, rank=0, world_size=1),
                                   num_workers=2),
        "loader-2-persistent-workers": loader(Ids(200), lambda ds: GlobalBatchSampler(ds, 8, seed=1, rank=0,
                                                                                      world_size=1),
                                              num_workers=2, persistent_workers=True),
        "shard-window-loader-2-workers": loader(ShardIds(200), lambda ds: ShardWindowSampler(
            ds, 8, seed=1, shards_at_once=3, rank=0, world_size=1), num_workers=2),
        "stream": lambda: RankBatchStream(Draws(), 4, seed=1, rank=0, world_size=1),
        "mixture-sampler": lambda: MixtureSampler(mixture(), 8, weights={"a": 1, "b": 1}, seed=1, rank=0,
                                                  world_size=1),
        "mixture-loader-0-workers": loader(mixture(), lambda ds: MixtureSampler(ds, 8, weights={"a": 1, "b": 1},
                                                                               seed=1, rank=0, world_size=1)),
        "mixture-loader-2-workers": loader(mixture(), lambda ds: MixtureSampler(ds, 8, weights={"a": 1, "b": 1},
                                                                               seed=1, rank=0, world_size=1),
                                           num_workers=2),
        "packed-loader": lambda: ResumableDataLoader(
            open_packed(packed), GlobalBatchSampler(open_packed(packed), 4, seed=1, rank=0, world_size=1),
            collate_fn=collate_packed),
        "parquet": lambda: ParquetTokenLoader(files, tokenizer, 2, 16, rank=0, world_size=1),
        "parquet-prefetch": lambda: ParquetTokenLoader(files, tokenizer, 2, 16, rank=0, world_size=1, prefetch=2,
                                                       prefetch_mode="thread"),
    }


KINDS = list(_makers(None, None, None))


def plain(batch):
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    if isinstance(batch, dict):
        return {k: plain(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [plain(b) for b in batch]
    return batch


def take(obj, n):
    # NOTE: iter() each time, as a `for` loop does: a stream's or the Parquet loader's iter is itself
    return [plain(b) for b in islice(iter(obj), n)]


def close(obj):
    if hasattr(obj, "close"):
        obj.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_loop_that_leaves_and_comes_back_gets_the_next_batch(kind, request, packed):
    needs_parquet = kind.startswith("parquet")
    parquet_dir = request.getfixturevalue("parquet_dir") if needs_parquet else None
    tokenizer = request.getfixturevalue("tokenizer") if needs_parquet else None
    make = _makers(parquet_dir, tokenizer, packed)[kind]
    whole = make()
    expected = take(whole, 9)
    after_nine = whole.state_dict()
    close(whole)

    obj = make()
    got = []
    for _ in range(3):
        for k, batch in enumerate(obj):
            got.append(plain(batch))
            if k == 2:
                break
        if len(got) == 3:
            state = obj.state_dict()
    assert got == expected
    assert obj.state_dict() == after_nine
    close(obj)

    resumed = make()
    resumed.load_state_dict(state)
    assert take(resumed, 6) == expected[3:]
    close(resumed)
