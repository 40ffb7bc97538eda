"""The CUDA path: pinned host batches, non_blocking copies, bf16 autocast. Skips where no GPU exists."""

from __future__ import annotations

import pytest
import torch

from niels_gpt.train.data import TrainData, to_model_batch
from niels_gpt.train.train import TrainConfig, train

from .conftest import TINY, VOCAB

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("kind", ["windows", "indexed", "packed"])
def test_batches_arrive_on_the_gpu_from_pinned_memory(kind, pretrain_cache, packed_dir):
    path, T = (packed_dir, 32) if kind == "packed" else (pretrain_cache, 16)
    data = TrainData(path, T=T, batch_size=4, seed=0, device="cuda", sampling="random" if kind == "windows" else "indexed",
                     num_workers=1 if kind != "windows" else 0)
    batch = next(data)
    assert all(v.is_cuda and v.is_contiguous() for v in batch.values())
    if kind != "windows":
        raw = next(data.source)  # a DataLoader with pin_memory=True hands over pinned host tensors
        assert raw["input_ids"].is_pinned()
    host = torch.arange(8).view(2, 4).pin_memory()
    moved = to_model_batch((host, host), torch.device("cuda"))
    torch.cuda.synchronize()
    assert moved["input_ids"].is_cuda and torch.equal(moved["input_ids"].cpu(), host)


def test_training_on_the_gpu_runs_resumes_and_reports_stall(tmp_path, pretrain_cache):
    token_bytes = torch.ones(VOCAB, dtype=torch.int64)
    cfg = dict(data=str(pretrain_cache), steps=6, device="cuda", **TINY)
    straight = train(TrainConfig(**cfg, out_dir=str(tmp_path / "straight")), token_bytes=token_bytes, log=lambda *a: None)
    assert next(straight.model.parameters()).is_cuda
    assert len(straight.stall) == 6 and all(0 <= s <= 100 for s in straight.stall)
    assert straight.val_bpb and straight.val_bpb[-1][1] > 0
    first = train(TrainConfig(**cfg, out_dir=str(tmp_path / "split"), stop_at=3), token_bytes=token_bytes,
                  log=lambda *a: None)
    second = train(TrainConfig(**cfg, out_dir=str(tmp_path / "split"), resume="latest"), token_bytes=token_bytes,
                   log=lambda *a: None)
    # bf16 kernels on the GPU need not be bitwise deterministic; the resumed run stays on the same path
    torch.testing.assert_close(torch.tensor(first.losses + second.losses), torch.tensor(straight.losses),
                               atol=5e-2, rtol=1e-2)


def test_flex_attention_on_the_gpu_equals_the_explicit_mask():
    from niels_gpt.train.attention import Attention

    from .test_attention import LAYOUTS, docs_from_lengths

    doc = docs_from_lengths(LAYOUTS["across flex blocks (T=200)"]).cuda()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, n, 200, 64, device="cuda", generator=g) for n in (4, 2, 2))
    torch.testing.assert_close(Attention(doc, "flex")(q, k, v), Attention(doc, "mask")(q, k, v), atol=2e-5, rtol=1e-5)


def test_packed_training_compiles_by_default_and_resumes(tmp_path, packed_dir):
    token_bytes = torch.ones(VOCAB, dtype=torch.int64)
    cfg = dict(data=str(packed_dir), steps=4, device="cuda", **{**TINY, "sequence_len": 32, "device_batch_size": 2})
    straight = train(TrainConfig(**cfg, out_dir=str(tmp_path / "straight")), token_bytes=token_bytes,
                     log=lambda *a: None)
    assert len(straight.losses) == 4 and all(0 < x < 20 for x in straight.losses)
    first = train(TrainConfig(**cfg, out_dir=str(tmp_path / "split"), stop_at=2), token_bytes=token_bytes,
                  log=lambda *a: None)
    second = train(TrainConfig(**cfg, out_dir=str(tmp_path / "split"), resume="latest"), token_bytes=token_bytes,
                   log=lambda *a: None)
    torch.testing.assert_close(torch.tensor(first.losses + second.losses), torch.tensor(straight.losses),
                               atol=5e-2, rtol=1e-2)
