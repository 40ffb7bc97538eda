"""The trainer's data glue: the loader kind by what a path holds, model batches, the train subcommand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from niels_gpt.cache.cli import main as cli
from niels_gpt.errors import ConfigError
from niels_gpt.loading import GlobalBatchSampler, RankBatchStream
from niels_gpt.seals import sealed_bytes
from niels_gpt.train.data import TrainData, detect_kind, to_model_batch

from ..conftest import write_pretrain_cache
from ..loading.conftest import write_parquet


def test_kind_follows_what_the_path_holds(tmp_path, pretrain_cache, sft_cache, packed_dir, mixture_file):
    assert detect_kind(pretrain_cache) == "indexed"  # the default: one global order, any number of ranks
    assert detect_kind(pretrain_cache, "random") == "windows"
    assert detect_kind(sft_cache) == "sft"
    assert detect_kind(packed_dir) == "packed"
    assert detect_kind(mixture_file) == "mixture"
    write_parquet(tmp_path / "text" / "shard_00000.parquet", ["a b c", "d e"], row_group_size=1)
    assert detect_kind(tmp_path / "text") == "parquet"


def test_paths_that_hold_no_training_data_are_refused(tmp_path, pretrain_cache, packed_dir):
    with pytest.raises(ConfigError, match="no such file or directory; check the path"):
        detect_kind(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="an empty directory, not a cache"):
        detect_kind(tmp_path / "empty")
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "meta.json").write_text(json.dumps({"kind": "tokenizer"}))
    with pytest.raises(ConfigError, match="kind 'tokenizer' is not trainable data"):
        detect_kind(tmp_path / "tok")
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "odd").mkdir()
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "odd" / "a.parquet")
    with pytest.raises(ConfigError, match="neither a 'text' column"):
        detect_kind(tmp_path / "odd")
    with pytest.raises(ConfigError, match="expected 'random' or 'indexed'"):
        detect_kind(pretrain_cache, "shuffled")
    with pytest.raises(ConfigError, match="pass --tokenizer"):
        TrainData(tmp_path / "odd", T=8, batch_size=2, seed=0, device="cpu", kind="parquet")
    with pytest.raises(ConfigError, match="train packed bins with --seq-len"):
        TrainData(packed_dir, T=8, batch_size=2, seed=0, device="cpu")


def test_batches_become_contiguous_model_inputs_without_tags(mixture_file, packed_dir):
    x = torch.arange(12).view(3, 4)
    out = to_model_batch((x.t(), x.t(), x.t() * 0 - 100), torch.device("cpu"))
    assert set(out) == {"input_ids", "labels"} and out["labels"].eq(-100).all() and out["input_ids"].is_contiguous()
    mix = TrainData(mixture_file, T=16, batch_size=4, seed=0, device="cpu")
    b = next(mix)
    assert set(b) == {"input_ids", "labels"}  # the mixture's dataset tag is dropped
    packed = TrainData(packed_dir, T=32, batch_size=2, seed=0, device="cpu")
    b = next(packed)
    assert set(b) == {"input_ids", "labels", "position_ids", "cu_seqlens"}
    assert b["cu_seqlens"].dtype == torch.int32 and int(b["cu_seqlens"][-1]) == 2 * 32


def test_train_subcommand_runs_and_the_loss_falls(tmp_path, capsys):
    periodic = np.arange(4000) % 37 + 10  # learnable: each token follows from the one before
    cache = write_pretrain_cache(tmp_path / "cache", {"train": [periodic], "val": [periodic[:400]]})
    rc = cli(["train", str(cache), "--out-dir", str(tmp_path / "run"), "--depth", "1", "--n-embd", "32",
              "--sequence-len", "16", "--device-batch-size", "8", "--steps", "12", "--sampling", "indexed",
              "--eval-steps", "2", "--optimizer", "adamw", "--warmdown-ratio", "0"])
    out = capsys.readouterr().out
    assert rc == 0 and (tmp_path / "run" / "ckpt_000012.pt").is_file()
    losses = [float(line.split("loss ")[1].split()[0]) for line in out.splitlines() if "| loss " in line]
    assert len(losses) == 12 and losses[-1] < 0.8 * losses[0]
    assert "% of dt)" in out and "tok/s" in out and "data wait = host time inside next(data)" in out
    assert "no tokenizer found above the data and none given (--tokenizer): val bpb is skipped" in out


def test_train_subcommand_reports_bad_data_in_one_line(tmp_path, capsys):
    assert cli(["train", str(tmp_path / "nothing"), "--out-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "no such file or directory; check the path" in err and "\n" not in err


def test_a_tokenizer_found_near_the_data_must_be_the_one_it_was_built_with(tmp_path, tokenizer, capsys):
    import shutil

    periodic = np.arange(2000) % 37 + 10
    cache = write_pretrain_cache(tmp_path / "pretrain" / "x", {"train": [periodic], "val": [periodic[:400]]})
    meta = json.loads((cache / "meta.json").read_text())
    (cache / "meta.json").write_bytes(sealed_bytes({**meta, "tokenizer_sha256": "ab" * 32}))
    shutil.copytree(Path(tokenizer.model_path).parent, tmp_path / "tokenizer")
    args = ["train", str(cache), "--out-dir", str(tmp_path / "run"), "--depth", "1", "--n-embd", "32",
            "--sequence-len", "16", "--steps", "1", "--eval-steps", "1"]
    assert cli(args) == 0
    out = capsys.readouterr().out
    assert "not the tokenizer" in out and "val bpb is skipped" in out and "final val bpb" not in out
    (cache / "meta.json").write_bytes(sealed_bytes({**meta, "tokenizer_sha256": tokenizer.sha256}))
    assert cli([*args, "--overwrite"]) == 0
    assert "final val bpb" in capsys.readouterr().out


@pytest.mark.parametrize("sampling", ["random", "indexed"])
def test_a_cache_built_without_a_val_split_trains_and_skips_val_bpb(tmp_path, tokenizer, sampling, capsys):
    # `build` without --val-frac makes no val split: train used to finish its steps, then fail at the final eval
    periodic = np.arange(2000) % 37 + 10
    cache = write_pretrain_cache(tmp_path / "pretrain" / "x", {"train": [periodic], "val": []})
    meta = json.loads((cache / "meta.json").read_text())
    assert meta["totals"]["val_tokens"] == 0
    (cache / "meta.json").write_bytes(sealed_bytes({**meta, "tokenizer_sha256": tokenizer.sha256}))
    args = ["train", str(cache), "--out-dir", str(tmp_path / "run"), "--depth", "1", "--n-embd", "32",
            "--sequence-len", "16", "--steps", "2", "--eval-steps", "1", "--eval-every", "1",
            "--sampling", sampling, "--tokenizer", str(Path(tokenizer.model_path).parent)]
    assert cli(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "no val split in this data: val bpb is skipped" in out and "val bpb " not in out.replace("val bpb is", "")
    assert (tmp_path / "run" / "ckpt_000002.pt").is_file()


def test_the_loader_hears_where_the_run_ends(pretrain_cache):
    # a remote cache's prefetch plan stops at the run's last batch (tests/storage: nothing past it is fetched)
    indexed = TrainData(pretrain_cache, T=16, batch_size=4, seed=0, device="cpu", sampling="indexed")
    sampler = indexed.source.loader.batch_sampler
    per_epoch = sampler.usable // 4
    indexed.end_after(per_epoch + 2)
    assert sampler.plan_end == (1, 2 * 4)
    windows = TrainData(pretrain_cache, T=16, batch_size=4, seed=0, device="cpu", sampling="random")
    next(windows)
    windows.end_after(7)
    assert windows.source.plan_end == 1 + 7


def test_a_seed_or_a_batch_count_that_is_not_an_integer_is_refused_not_cut(pretrain_cache, mixture_file):
    """A seed of 2.5 read seed 2's order, and end_after(2.5) planned 2 batches: each is refused by name."""
    for seed in (2.5, True, "3"):
        with pytest.raises(ConfigError, match=rf"^seed {seed!r}: must be an integer"):
            TrainData(pretrain_cache, T=16, batch_size=4, seed=seed, device="cpu")
    with pytest.raises(ConfigError, match=r"GlobalBatchSampler: seed 2.5: must be an integer"):
        GlobalBatchSampler(range(64), 8, seed=2.5, rank=0, world_size=1)
    with pytest.raises(ConfigError, match=r"RankBatchStream: seed 1.0: must be an integer"):
        RankBatchStream(None, 8, seed=1.0, rank=0, world_size=1)
    assert GlobalBatchSampler(range(64), 8, seed=np.int64(3), rank=0, world_size=1).seed == 3  # numpy's ints are
    for kw in ({"sampling": "indexed"}, {"sampling": "random"}, {}):  # a sampler's, a stream's, a mixture's
        data = TrainData(mixture_file if not kw else pretrain_cache, T=16, batch_size=4, seed=0, device="cpu", **kw)
        for bad in (2.5, True, -1):
            with pytest.raises(ConfigError, match=rf"end_after: {bad!r} batches \({type(bad).__name__}\); expected 0 or "
                                                  "more, an integer"):
                data.end_after(bad)
        data.end_after(np.int64(2))
        data.close()


def test_a_mixture_resumes_at_the_batch_delivered_whatever_was_made_ahead(mixture_file):
    import threading

    earlier = set(threading.enumerate())  # threads of other tests in this process are not this run's
    straight = TrainData(mixture_file, T=16, batch_size=4, seed=0, device="cpu")
    want = [next(straight)["input_ids"] for _ in range(5)]
    straight.close()
    run = TrainData(mixture_file, T=16, batch_size=4, seed=0, device="cpu")
    for _ in range(2):
        next(run)  # the loader assembles batches ahead on a thread; its state is the second batch's
    state = json.loads(json.dumps(run.state_dict()))
    run.close()
    assert not [t for t in set(threading.enumerate()) - earlier if t.name == "batch-prefetch"]
    resumed = TrainData(mixture_file, T=16, batch_size=4, seed=0, device="cpu")
    resumed.load_state_dict(state)
    assert all(torch.equal(next(resumed)["input_ids"], w) for w in want[2:])
    resumed.close()


def test_parquet_val_batches_leave_no_producer_running(tmp_path, tokenizer, real_docs):
    import threading

    for i in range(2):
        write_parquet(tmp_path / "text" / f"shard_{i:05d}.parquet", real_docs[i * 10:(i + 1) * 10], row_group_size=4)
    data = TrainData(tmp_path / "text", T=16, batch_size=2, seed=0, device="cpu", tokenizer=tokenizer, prefetch=0)
    before = {t for t in threading.enumerate() if t.name == "batch-prefetch"}
    batches = data.val_batches(2)
    assert len(batches) == 2 and batches[0][0].shape == (2, 16)
    assert {t for t in threading.enumerate() if t.name == "batch-prefetch"} <= before  # the val loader's has ended
    assert data.val_batches(2)[1][0].equal(batches[1][0])  # the same rows every call
    data.close()
