"""Fine-tuning on packed bins reports val bpb when a val pack of the SFT cache's val split is beside them."""

import pytest
import torch

from niels_gpt.errors import ConfigError
from niels_gpt.loading import evaluate_bpb
from niels_gpt.packing import pack_sft
from niels_gpt.train.data import TrainData
from niels_gpt.train.model import GPT, GPTConfig
from niels_gpt.train.train import TrainConfig, train
from niels_gpt.train.val import find_val_pack, score

ONES = torch.ones(2004, dtype=torch.int64)
T = 32


def pack(sft_cache, out, split="train", pack_size=T, val=True):
    pack_sft(sft_cache, out, pack_size=pack_size, algorithm="ffd", on_overflow="truncate", split=split, warn=False,
             val=val)
    return out


@pytest.fixture(scope="module")
def packed_pair(tmp_path_factory, sft_cache):
    root = tmp_path_factory.mktemp("packed") / "chat"
    return pack(sft_cache, root / "train", val=False), pack(sft_cache, root / "val", split="val")


def run(data, out, **kw):
    cfg = TrainConfig(data=str(data), out_dir=str(out), steps=4, depth=1, n_embd=32, n_head=2, sequence_len=T,
                      device_batch_size=2, eval_steps=2, log_every=0, **kw)
    return train(cfg, token_bytes=ONES, log=lambda *a: None)


def test_packed_bins_with_a_val_pack_beside_them_report_val_bpb(packed_pair, tmp_path):
    result = run(packed_pair[0], tmp_path / "run", eval_every=2)
    assert [s for s, _ in result.val_bpb] == [2, 4] and all(0 < v < 50 for _, v in result.val_bpb)


def test_a_val_pack_inside_the_bins_directory_is_found_too(sft_cache, tmp_path):
    bins = pack(sft_cache, tmp_path / "bins")  # pack-sft packs the val split into OUT/val/ itself
    assert find_val_pack(bins, T=T, tokenizer_sha256=None) == bins / "val"
    assert run(bins, tmp_path / "run").val_bpb[-1][0] == 4


def test_packed_bins_without_a_val_pack_say_how_to_get_one(sft_cache, tmp_path):
    bins = pack(sft_cache, tmp_path / "bins", val=False)
    said = []
    cfg = TrainConfig(data=str(bins), out_dir=str(tmp_path / "run"), steps=1, depth=1, n_embd=32, n_head=2,
                      sequence_len=T, device_batch_size=2, eval_steps=2, log_every=0)
    assert train(cfg, token_bytes=ONES, log=said.append).val_bpb == []
    assert any("val bpb is skipped" in m and "without --no-val" in m and "--split val" not in m for m in said)


def test_packed_val_rows_score_each_document_as_it_would_alone(packed_pair):
    data = TrainData(packed_pair[0], T=T, batch_size=2, seed=0, device="cpu")
    batches = data.val_batches(2)
    torch.manual_seed(0)
    model = GPT(GPTConfig(sequence_len=T, vocab_size=2004, n_layer=1, n_head=2, n_kv_head=2, n_embd=32))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # init_weights zeroes the output projections: attention would not matter
            p.normal_(0, 0.2, generator=g)
    model.eval()
    alone = []
    for b in batches:
        cu, row_len = b["cu_seqlens"].tolist(), b["input_ids"].shape[1]
        for a, e in zip(cu[:-1], cu[1:], strict=True):
            r, a0 = divmod(a, row_len)
            alone.append((b["input_ids"][r, a0:a0 + e - a][None], b["labels"][r, a0:a0 + e - a][None]))
    assert len(alone) > 2 * len(batches)  # rows of several documents
    assert abs(score(model, batches, ONES) - evaluate_bpb(model, alone, ONES)) < 1e-5
    assert abs(score(model, batches, ONES) - evaluate_bpb(model, [(b["input_ids"], b["labels"]) for b in batches],
                                                          ONES)) > 1e-4  # the layout matters


def test_a_val_pack_of_another_pack_size_is_named(sft_cache, tmp_path):
    bins = pack(sft_cache, tmp_path / "chat" / "train", val=False)
    pack(sft_cache, tmp_path / "chat" / "val", split="val", pack_size=2 * T)
    with pytest.raises(ConfigError, match=r"chat/val: the val pack of .*chat/train has pack_size 64, the train bins "
                                          r"32: pack the val split again with --seq-len 32"):
        TrainData(bins, T=T, batch_size=2, seed=0, device="cpu")
