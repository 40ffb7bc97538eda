"""N steps straight == N/2 steps, checkpoint, resume, N/2 steps: the same losses bit for bit, every loader kind."""

from __future__ import annotations

import pytest
import torch

from niels_gpt.errors import ConfigError, StateError
from niels_gpt.train.config import flag_of
from niels_gpt.train.train import TrainConfig, latest_checkpoint, load_checkpoint, train

from ..conftest import SPECIALS, sample_texts
from ..loading.conftest import write_parquet
from .conftest import TINY, VOCAB

STEPS = 6
TOKEN_BYTES = torch.ones(VOCAB, dtype=torch.int64)
TOKEN_BYTES[list(SPECIALS.values())] = 0


def run(data, out, token_bytes=TOKEN_BYTES, **kw):
    cfg = TrainConfig(data=str(data), out_dir=str(out), steps=STEPS, **{**TINY, **kw})
    return train(cfg, token_bytes=token_bytes, log=lambda *a: None, record_rows=True)


def straight_then_resumed(tmp_path, data, first_kw=None, second_kw=None, **kw):
    straight = run(data, tmp_path / "straight", **kw)
    first = run(data, tmp_path / "split", stop_at=STEPS // 2, **{**kw, **(first_kw or {})})
    second = run(data, tmp_path / "split", resume="latest", **{**kw, **(second_kw or {})})
    return straight, first, second


@pytest.mark.parametrize("kind", ["windows", "indexed", "mixture", "sft", "packed"])
def test_resume_reproduces_the_straight_run_bit_for_bit(tmp_path, kind, pretrain_cache, mixture_file, sft_cache,
                                                       packed_dir):
    data, kw = {"windows": (pretrain_cache, {"sampling": "random", "total_batch_size": 2 * 4 * 16}),  # 2 micro-batches a step
                "indexed": (pretrain_cache, {"sampling": "indexed"}),
                "mixture": (mixture_file, {}),
                "sft": (sft_cache, {}),
                "packed": (packed_dir, {"sequence_len": 32, "device_batch_size": 2})}[kind]
    straight, first, second = straight_then_resumed(tmp_path, data, **kw)
    assert len(straight.losses) == STEPS and len(first.losses) == len(second.losses) == STEPS // 2
    assert first.losses + second.losses == straight.losses  # exact float equality
    assert first.rows + second.rows == straight.rows  # and the same rows
    assert all(0 < x < 20 for x in straight.losses)
    if kind != "packed":  # packed bins are one split: no val
        assert second.val_bpb[-1] == straight.val_bpb[-1]


@pytest.mark.parametrize("kind", ["indexed", "mixture"])
def test_resume_after_a_worker_count_change(tmp_path, kind, pretrain_cache, mixture_file):
    data, kw = (pretrain_cache, {"sampling": "indexed"}) if kind == "indexed" else (mixture_file, {})
    straight, first, second = straight_then_resumed(tmp_path, data, first_kw={"num_workers": 0},
                                                    second_kw={"num_workers": 2}, **kw)
    assert first.losses + second.losses == straight.losses
    assert first.rows + second.rows == straight.rows


@pytest.mark.parametrize("packing,prefetch", [("contiguous", 4), ("bestfit", 8)])
def test_resume_of_parquet_shards_tokenized_on_the_fly(tmp_path, tokenizer, packing, prefetch):
    """Prefetch depth N: the loader runs up to N batches ahead, and the checkpoint still holds the position of
    the batches the steps took."""
    texts = [t for t in sample_texts() if t.strip()]
    paras = [p for t in texts for p in t.split("\n\n") if p.strip()][:120]
    for i in range(3):
        write_parquet(tmp_path / "pq" / f"shard_{i:05d}.parquet", paras[i::3], row_group_size=8)
    tb = torch.as_tensor(tokenizer.token_byte_lengths(), dtype=torch.int64)
    straight, first, second = straight_then_resumed(tmp_path, tmp_path / "pq", token_bytes=tb, prefetch=prefetch,
                                                    tokenizer=str(tokenizer.model_path), packing=packing)
    assert first.losses + second.losses == straight.losses
    assert first.rows + second.rows == straight.rows
    assert straight.val_bpb and straight.val_bpb[-1][1] > 0


def test_a_run_started_with_init_from_resumes_without_it_as_its_resume_command_does(tmp_path, pretrain_cache):
    """Its model's shape came from the base checkpoint, by no flag; resumed without --init-from (the printed resume
    command leaves it out) it was built at the default size and refused: "resume with the same model flags"."""
    base = run(pretrain_cache, tmp_path / "base", stop_at=2)
    unsized = {"depth": None, "n_embd": None, "n_head": None}  # TINY's shape: the base's, given by no flag
    straight = run(pretrain_cache, tmp_path / "straight", init_from=base.checkpoint, **unsized)
    first = run(pretrain_cache, tmp_path / "split", init_from=base.checkpoint, stop_at=STEPS // 2, **unsized)
    second = run(pretrain_cache, tmp_path / "split", resume="latest", **unsized)
    assert first.losses + second.losses == straight.losses


def test_checkpoint_holds_model_optimizers_step_rng_and_loader(tmp_path, pretrain_cache):
    run(pretrain_cache, tmp_path, stop_at=2, sampling="random")
    ckpt = load_checkpoint(latest_checkpoint(tmp_path))
    assert ckpt["step"] == 2 and len(ckpt["optimizers"]) == 2  # AdamW + Muon
    assert "transformer.wte.weight" in ckpt["model"] and ckpt["rng"]["cpu"].dtype == torch.uint8
    assert ckpt["loader"][0] == {"kind": "windows", "loader": ckpt["loader"][0]["loader"]}
    assert ckpt["loader"][0]["loader"]["step"] == 2  # two batches taken by two steps


def test_resume_refuses_another_model_and_a_missing_checkpoint(tmp_path, pretrain_cache):
    with pytest.raises(StateError, match="no ckpt_"):
        run(pretrain_cache, tmp_path / "none", resume="latest")
    run(pretrain_cache, tmp_path / "run", stop_at=1)
    with pytest.raises(StateError, match="resume with the same model flags"):
        run(pretrain_cache, tmp_path / "run", resume="latest", n_embd=64)
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(StateError, match="not a readable checkpoint"):
        run(pretrain_cache, tmp_path / "new", resume=str(tmp_path / "bad.pt"))


def test_resume_refuses_a_checkpoint_of_other_data(tmp_path, pretrain_cache, sft_cache):
    run(pretrain_cache, tmp_path / "run", stop_at=1)
    with pytest.raises(ConfigError, match="resume with the same data"):
        run(sft_cache, tmp_path / "run", resume="latest")


def test_total_batch_must_be_a_multiple_of_a_micro_batch(tmp_path, pretrain_cache):
    with pytest.raises(ConfigError, match="not a multiple of device_batch_size"):
        run(pretrain_cache, tmp_path, total_batch_size=100)


def test_two_accumulated_micro_batches_equal_one_batch_of_both(tmp_path, pretrain_cache):
    """Indexed windows: micro-batches of 4 in sampler order are the halves of the batch of 8."""
    kw = {"sampling": "indexed", "grad_clip": 0.0, "seed": 0}  # the weights the tolerances below were set on
    big = run(pretrain_cache, tmp_path / "big", device_batch_size=8, **kw)
    accum = run(pretrain_cache, tmp_path / "accum", device_batch_size=4, total_batch_size=8 * 16, **kw)
    assert [a + b for a, b in zip(accum.rows[::2], accum.rows[1::2], strict=True)] == big.rows
    torch.testing.assert_close(torch.tensor(accum.losses), torch.tensor(big.losses), atol=1e-5, rtol=1e-5)
    # NOTE: summation order differs, and Adam's g / sqrt(v) (and Muon's orthogonalisation) turn rounding
    # in near-zero gradients into visible steps for a few elements: up to ~1e-3, against steps of 1e-2+.
    for p, q in zip(accum.model.parameters(), big.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("flag,value,old", [("seed", 7, 42), ("matrix_lr", 0.5, 0.02), ("device_batch_size", 2, 4),
                                            ("optimizer", "adamw", "muon"), ("sampling", "random", "indexed")])
def test_resume_refuses_a_changed_setting_naming_the_flag_and_both_values(tmp_path, pretrain_cache, flag, value, old):
    """It would run on with the run's own settings (the optimizer state holds the learning rates, the loader
    state the data order) while the new checkpoint and run.json recorded the new ones."""
    first = run(pretrain_cache, tmp_path / "run", stop_at=1)
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    dashed = flag_of(flag)
    with pytest.raises(StateError, match=rf"--resume .*ckpt_000001.pt: {dashed} {value} \(the run has {old}\): a "
                                         rf"resumed run goes on with the settings it started with .* resume with "
                                         rf"{dashed} {old}, or start a new run from its weights with --init-from"):
        run(pretrain_cache, tmp_path / "run", resume="latest", **{flag: value})
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before
    if flag == "seed":  # the implicit total batch given explicitly is the same setting
        same = run(pretrain_cache, tmp_path / "run", resume="latest", total_batch_size=4 * 16)
        assert len(first.losses) == 1 and len(same.losses) == STEPS - 1
