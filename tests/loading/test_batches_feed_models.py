"""Every loader's batches feed a model as they come: contiguous tensors (`targets.view(-1)` works), and
`evaluate_bpb` takes them whatever their shape (tuples, dicts, tagged mixture items)."""

from itertools import islice

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.cache.sft_dataset import SFTExampleDataset
from niels_gpt.formats.kempner_dataset import MemoryMappedDataset
from niels_gpt.formats.nanogpt_dataset import NanogptDataset
from niels_gpt.loading import (
    GlobalBatchSampler,
    IndexedWindowDataset,
    MixtureDataset,
    MixtureSampler,
    ParquetTokenLoader,
    RankBatchStream,
    ResumableDataLoader,
    evaluate_bpb,
    list_parquet_files,
)
from niels_gpt.loading.bpb import batch_inputs_targets
from niels_gpt.packing import collate_packed, open_packed, pack_sft

from ..conftest import SPECIALS, write_pretrain_cache, write_sft_cache

VOCAB = 2004


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    shards = {s: [torch.randint(5, 500, (n,), generator=g).numpy().astype(np.uint16) for n in (700, 513)]
              for s in ("train", "val")}
    for arrs in shards.values():
        for a in arrs:
            a[::37] = SPECIALS["eot"]
    return write_pretrain_cache(tmp_path_factory.mktemp("c") / "cache", shards)


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    a, e = SPECIALS["asst"], SPECIALS["eot"]
    rows = [[SPECIALS["usr"], 7, 8, a, 9, 10, 11, e] * (1 + i % 3) for i in range(12)]
    return write_sft_cache(tmp_path_factory.mktemp("s") / "sft", rows)


def batches(kind, cache, sft, parquet_dir, tokenizer, tmp_path):
    """Three batches of the loader `kind`, as a training loop receives them."""
    if kind.startswith("parquet"):
        loader = ParquetTokenLoader(list_parquet_files(parquet_dir), tokenizer, B=3, T=40,
                                    packing=kind.split("-")[1], rank=0, world_size=1)
        return [next(loader) for _ in range(3)]
    g = torch.Generator().manual_seed(1)
    if kind == "windows":
        ds = PretrainTokenStreamDataset(str(cache / "train"), T=32, device="cpu")
        return [ds.get_batch(B=4, generator=g) for _ in range(3)]
    if kind == "stream":
        ds = PretrainTokenStreamDataset(str(cache / "train"), T=32, device="cpu")
        return [b for b in islice(RankBatchStream(ds, 4, seed=0, rank=0, world_size=1), 3)]
    if kind == "sft":
        ds = SFTExampleDataset(str(sft / "train_tokens.bin"), str(sft / "train_idx.npy"), T=16, device="cpu",
                               eot_id=SPECIALS["eot"])
        return [ds.get_batch(B=4, generator=g) for _ in range(3)]
    if kind == "indexed":
        ds = IndexedWindowDataset(cache, T=32)
        return [b for b in islice(ResumableDataLoader(ds, GlobalBatchSampler(ds, 4, seed=0)), 3)]
    if kind == "mixture":
        mix = MixtureDataset({"a": IndexedWindowDataset(cache, T=32), "b": IndexedWindowDataset(cache, T=32)})
        s = MixtureSampler(mix, 4, weights={"a": 1, "b": 1}, seed=0, rank=0, world_size=1)
        return [b for b in islice(ResumableDataLoader(mix, s), 3)]
    if kind == "kempner":
        return [b for b in islice(DataLoader(MemoryMappedDataset(cache / "train", 32), batch_size=4), 3)]
    if kind == "nanogpt":
        return [b for b in islice(DataLoader(NanogptDataset(str(cache / "train"), 32), batch_size=4), 3)]
    if kind == "packed":
        pack_sft(str(sft), str(tmp_path / "packed"), pack_size=32)
        return list(islice(DataLoader(open_packed(tmp_path / "packed"), batch_size=2, collate_fn=collate_packed), 3))
    raise AssertionError(kind)


KINDS = ["windows", "stream", "sft", "indexed", "mixture", "kempner", "nanogpt", "packed", "parquet-contiguous",
         "parquet-bestfit"]


class Bigram(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(VOCAB, VOCAB)

    def forward(self, x):
        return self.table(x)


@pytest.mark.parametrize("kind", KINDS)
def test_every_tensor_of_every_batch_is_contiguous(kind, cache, sft, parquet_dir, tokenizer, tmp_path):
    for batch in batches(kind, cache, sft, parquet_dir, tokenizer, tmp_path):
        tensors = batch.values() if isinstance(batch, dict) else batch
        for t in tensors:
            if isinstance(t, torch.Tensor):
                assert t.is_contiguous()
        x, y = batch_inputs_targets(batch)
        y.view(-1)  # what a nanochat-style model does with its targets


@pytest.mark.parametrize("kind", KINDS)
def test_evaluate_bpb_takes_every_loaders_batches(kind, cache, sft, parquet_dir, tokenizer, tmp_path):
    got = batches(kind, cache, sft, parquet_dir, tokenizer, tmp_path)
    lengths = torch.tensor([1] * VOCAB)
    lengths[list(SPECIALS.values())] = 0
    model = Bigram()
    bpb = evaluate_bpb(model, got, lengths)
    # the same sum by hand over the (inputs, targets) pairs
    nats, nbytes = 0.0, 0
    for batch in got:
        x, y = batch_inputs_targets(batch)
        with torch.no_grad():
            logp = torch.log_softmax(model(x).float(), -1)
        for xi, yi in zip(logp.reshape(-1, VOCAB), y.reshape(-1), strict=True):
            if yi >= 0 and lengths[yi] > 0:
                nats -= float(xi[yi])
                nbytes += 1
    assert bpb == pytest.approx(nats / (np.log(2) * nbytes), rel=1e-5)


def test_batch_inputs_targets_rules():
    x, y, m = torch.zeros(2, 3), torch.ones(2, 3), torch.full((2, 3), 2)
    assert batch_inputs_targets((x, y))[1] is y
    assert batch_inputs_targets((x, y, m))[1] is m          # SFT rows: the masked targets
    assert batch_inputs_targets((x, y, "web"))[1] is y      # a mixture's tag is skipped
    assert batch_inputs_targets({"input_ids": x, "labels": y, "dataset": "web"}) == (x, y)
    with pytest.raises(Exception, match="input_ids.*labels"):
        batch_inputs_targets({"tokens": x})
    with pytest.raises(Exception, match="two tensors"):
        batch_inputs_targets((x, "web"))
