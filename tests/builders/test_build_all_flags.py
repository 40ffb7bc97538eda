"""build-all takes every constant as a flag: each applies where it means something, and every flag is checked
before anything is built."""

from __future__ import annotations

import os
from pathlib import Path

from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta


def test_shard_bytes_and_shuffle_buffer_shape_pretraining_caches_and_leave_sft_caches_alone(tokenizer, tmp_path,
                                                                                           capsys):
    root = tmp_path / "c"
    rc = main(["build-all", "--cache-dir", str(root), "--sample", "--only", "roam", "dolly15k", "--tokenizer",
               tokenizer.model_path, "--shard-bytes", "65536", "--shuffle-buffer", "100", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    shards = sorted((root / "pretrain" / "roam" / "train").glob("shard_*.bin"))
    assert len(shards) > 1 and max(os.path.getsize(s) for s in shards) <= 65536
    assert read_meta(str(root / "sft" / "dolly15k"))["totals"]["train_examples"] > 0


def test_a_refused_cache_recipe_stops_the_run_before_the_tokenizer_is_written(tokenizer, tmp_path, capsys):
    root = tmp_path / "c"
    rc = main(["build-all", "--cache-dir", str(root), "--only", "tokenizer", "roam", "--tokenizer",
               tokenizer.model_path, "--no-progress"])
    assert rc == 1
    assert "--roam-dir" in capsys.readouterr().err
    assert not Path(root).exists()
