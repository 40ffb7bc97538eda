"""Bad-input catalogue: loader and sampler resume states (a checkpoint's loader state edited by hand), and
the arguments they are made with (a seed, the batches a run takes).

Each state case takes a good state_dict() from a fresh loader, breaks one field, and loads it: the refusal is
a NielsGPTError whose message is one line naming the field and the bad value, and the loader's own state is
unchanged (nothing half-applied), so it goes on from where it was. Each argument case makes the call with one
bad argument: one line naming the parameter and the value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from niels_gpt.errors import NielsGPTError
from niels_gpt.loading import (
    GlobalBatchSampler,
    MixtureDataset,
    MixtureSampler,
    ParquetTokenLoader,
    RankBatchStream,
    ResumableDataLoader,
    ShardWindowSampler,
)
from niels_gpt.resume import fingerprint
from niels_gpt.train.data import TrainData

from .conftest import write_pretrain_cache
from .loading.conftest import write_parquet


class Ids(Dataset):
    def __init__(self, n=64):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor(i)

    def fingerprint(self):
        return fingerprint("ids", self.n)

    def shard_counts(self):
        return [16] * (self.n // 16)


class Draws:
    def get_batch(self, B, generator):
        return torch.randint(0, 100, (B,), generator=generator)

    def fingerprint(self):
        return "draws"


def _sampler(tmp):
    return GlobalBatchSampler(Ids(), 8, seed=0, rank=0, world_size=1)


def _loader(tmp):
    ds = Ids()
    return ResumableDataLoader(ds, GlobalBatchSampler(ds, 8, seed=0, rank=0, world_size=1))


def _shards(tmp):
    return ShardWindowSampler(Ids(), 8, seed=0, shards_at_once=2, rank=0, world_size=1)


def _stream(tmp):
    return RankBatchStream(Draws(), 4, seed=0, rank=0, world_size=1)


def _mixture(tmp):
    mix = MixtureDataset({"a": Ids(64), "b": Ids(32)})
    return MixtureSampler(mix, 8, weights={"a": 1, "b": 1}, seed=0, rank=0, world_size=1)


def _parquet(packing):
    def make(tmp, tokenizer):
        texts = [f"document {i} " * (1 + i % 5) for i in range(40)]
        path = write_parquet(tmp / "p" / "shard_00000.parquet", texts, row_group_size=8)
        return ParquetTokenLoader([path], tokenizer, 2, 8, packing=packing, rank=0, world_size=1, buffer_size=4)
    return make


@dataclass
class Case:
    name: str
    make: Callable  # tmp (, tokenizer) -> a loader with state_dict/load_state_dict
    field: str
    value: object
    expect: tuple[str, ...]  # phrases the one error line contains (case-insensitive)
    tokenizer: bool = False


CASES = [
    Case("sampler_epoch_negative", _sampler, "epoch", -1, ("epoch = -1", "integer >= 0")),
    Case("sampler_consumed_negative", _sampler, "samples_consumed", -8, ("samples_consumed = -8", ">= 0")),
    Case("sampler_consumed_not_an_integer", _sampler, "samples_consumed", 2.5, ("samples_consumed = 2.5",)),
    Case("sampler_consumed_a_string", _sampler, "samples_consumed", "8", ("samples_consumed = '8'",)),
    Case("sampler_consumed_past_the_data", _sampler, "samples_consumed", 10**6, ("samples_consumed = 1000000",
                                                                                 "0..64")),
    Case("sampler_seed_a_string", _sampler, "seed", "zero", ("seed = 'zero'", "integer")),
    Case("sampler_epoch_a_bool", _sampler, "epoch", True, ("epoch = true",)),
    Case("loader_epoch_negative", _loader, "epoch", -1, ("epoch = -1",)),
    Case("shard_sampler_consumed_negative", _shards, "samples_consumed", -3, ("samples_consumed = -3",)),
    Case("stream_step_negative", _stream, "step", -3, ("step = -3", "integer >= 0")),
    Case("stream_step_a_float", _stream, "step", 3.0, ("step = 3.0",)),
    Case("mixture_step_negative", _mixture, "step", -3, ("step = -3",)),
    Case("mixture_drawn_negative", _mixture, "drawn", [-1, 0], ("drawn[0] = -1",)),
    Case("mixture_drawn_not_a_list", _mixture, "drawn", "12", ("drawn = '12'", "list")),
    Case("mixture_carry_not_finite", _mixture, "carry", [float("nan"), 0.0], ("carry = [nan, 0.0]", "finite")),
    Case("mixture_carry_a_string", _mixture, "carry", ["0.5", 0.0], ("carry = ['0.5', 0.0]",)),
    Case("parquet_next_doc_negative", _parquet("contiguous"), "next_doc", -1, ("next_doc = -1",), tokenizer=True),
    Case("parquet_offset_a_string", _parquet("contiguous"), "offset", "3", ("offset = '3'",), tokenizer=True),
    Case("parquet_buffer_negative", _parquet("bestfit"), "buffer", [1, -2], ("buffer[1] = -2",), tokenizer=True),
    Case("parquet_buffer_past_next_doc", _parquet("bestfit"), "buffer", [10**6], ("buffer", "next_doc"),
         tokenizer=True),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_loader_state_is_refused_in_one_line(case, tmp_path, request):
    args = (tmp_path, request.getfixturevalue("tokenizer")) if case.tokenizer else (tmp_path,)
    loader = case.make(*args)
    good = loader.state_dict()
    with pytest.raises(NielsGPTError) as info:
        loader.load_state_dict({**good, case.field: case.value})
    message = str(info.value)
    assert "\n" not in message, message
    for phrase in case.expect:
        assert phrase.lower() in message.lower(), message
    assert loader.state_dict() == good
    loader.load_state_dict(good)  # the untouched state still loads
    if hasattr(loader, "close"):
        loader.close()


def _train_data(tmp, **kw):
    cache = write_pretrain_cache(tmp / "cache", {"train": [np.arange(600) % 90 + 5]}, vocab_size=100)
    return TrainData(cache, T=16, batch_size=2, device="cpu", **{"seed": 0, **kw})


ARGUMENTS = [  # (name, the call refused, phrases of its one line)
    ("sampler_seed_a_float", lambda tmp: GlobalBatchSampler(Ids(), 8, seed=2.5, rank=0, world_size=1),
     ("GlobalBatchSampler: seed 2.5", "must be an integer")),
    ("shard_sampler_seed_a_bool", lambda tmp: ShardWindowSampler(Ids(), 8, seed=True, rank=0, world_size=1),
     ("ShardWindowSampler: seed True", "must be an integer")),
    ("stream_seed_a_float", lambda tmp: RankBatchStream(Draws(), 4, seed=0.5, rank=0, world_size=1),
     ("RankBatchStream: seed 0.5", "must be an integer")),
    ("mixture_sampler_seed_a_float", lambda tmp: MixtureSampler(MixtureDataset({"a": range(50)}), 8, weights={"a": 1},
                                                                seed=2.5, rank=0, world_size=1),
     ("MixtureSampler: seed 2.5", "must be an integer")),
    ("train_data_seed_a_float", lambda tmp: _train_data(tmp, seed=2.5), ("seed 2.5", "must be an integer")),
    ("sampler_end_after_a_float", lambda tmp: _sampler(tmp).end_after(2.5),
     ("end_after: 2.5 batches (float)", "expected 0 or more, an integer")),
    ("stream_end_after_a_bool", lambda tmp: _stream(tmp).end_after(True),
     ("end_after: True batches (bool)", "expected 0 or more, an integer")),
    ("train_data_end_after_a_float", lambda tmp: _train_data(tmp).end_after(2.5),
     ("end_after: 2.5 batches (float)", "expected 0 or more, an integer")),
]


@pytest.mark.parametrize(("name", "call", "expect"), ARGUMENTS, ids=[a[0] for a in ARGUMENTS])
def test_a_bad_loader_argument_is_refused_in_one_line(name, call, expect, tmp_path):
    with pytest.raises(NielsGPTError) as info:
        call(tmp_path)
    message = str(info.value)
    assert "\n" not in message, message
    for phrase in expect:
        assert phrase.lower() in message.lower(), message
