"""The library's tokenizer trained on your own files (train-tokenizer SRC..., build --train-tokenizer, build-all
--only tokenizer NAME), and the one rule by which train, stats, inspect and verify find a cache's tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta
from niels_gpt.sources import SAMPLE_DIR
from niels_gpt.tokenizer.find import tokenizer_of

VOCAB = "600"


@pytest.fixture
def my_data(tmp_path):
    d = tmp_path / "my-data"
    shutil.copytree(SAMPLE_DIR / "roam", d)
    return d


def _ok(argv, capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 0
    return capsys.readouterr().err


def test_train_tokenizer_on_a_folder_offline_then_build_with_it(my_data, tmp_path, capsys):
    _ok(["train-tokenizer", str(my_data), "--out", str(tmp_path / "tok"), "--vocab-size", VOCAB, "--no-progress"],
        capsys)
    meta = read_meta(str(tmp_path / "tok"))
    assert meta["kind"] == "tokenizer" and meta["vocab_size"] == int(VOCAB) + 4
    assert meta["trained_on"]["files"] and meta["training_text"]["documents"] == len(list(my_data.rglob("*.md")))
    _ok(["build", str(my_data), "--out", str(tmp_path / "cache" / "mine"), "--tokenizer", str(tmp_path / "tok"),
         "--no-progress"], capsys)
    cache = read_meta(str(tmp_path / "cache" / "mine"))
    assert cache["tokenizer_sha256"] == meta["tokenizer_sha256"]
    # one door: the tokenizer anywhere is found again from the cache alone (its recorded path)
    assert cache["tokenizer"]["path"] == str((tmp_path / "tok" / "spm.model").resolve())
    assert tokenizer_of(tmp_path / "cache" / "mine").sha256 == meta["tokenizer_sha256"]
    assert tokenizer_of(tmp_path / "cache" / "mine" / "train").sha256 == meta["tokenizer_sha256"]
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "cache" / "mine")]) == 0
    assert "first" in capsys.readouterr().out  # a decoded window, without --tokenizer


def test_progress_shows_reading_then_training_with_an_estimate(my_data, tmp_path):
    import contextlib
    import io

    from niels_gpt.builders.tokenizer import train_on_sources
    from niels_gpt.tokenizer import TrainSettings

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        train_on_sources([my_data], tmp_path / "tok", settings=TrainSettings(vocab_size=int(VOCAB)), progress=True)
    text = err.getvalue()
    assert "tokenizer: reading text" in text and "tokenizer: training (bpe, 600 pieces, about" in text


def test_build_train_tokenizer_trains_into_the_output_root_then_reuses_it(my_data, tmp_path, capsys):
    argv = ["build", str(my_data), "--out", str(tmp_path / "cache" / "mine"), "--train-tokenizer", VOCAB,
            "--no-progress"]
    _ok(argv, capsys)
    tok = read_meta(str(tmp_path / "cache" / "tokenizer"))
    cache = read_meta(str(tmp_path / "cache" / "mine"))
    assert cache["tokenizer_sha256"] == tok["tokenizer_sha256"] and "path" not in cache["tokenizer"]
    assert "reusing" in _ok(argv, capsys)  # the same sources and settings: not trained again
    assert read_meta(str(tmp_path / "cache" / "tokenizer")) == tok
    capsys.readouterr()
    assert main([*argv[:-3], "--train-tokenizer", "700", "--no-progress"]) == 1
    assert "holds a tokenizer trained on other text or settings" in capsys.readouterr().err


@pytest.mark.parametrize("vocab", ["0", "-5", "100"])
def test_a_vocabulary_below_what_a_model_holds_is_refused_before_reading(my_data, tmp_path, capsys, vocab):
    capsys.readouterr()
    assert main(["train-tokenizer", str(my_data), "--out", str(tmp_path / "tok"), "--vocab-size", vocab,
                 "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --vocab-size") and "at least 260" in err[-1] and "256 byte pieces" in err[-1]
    assert not (tmp_path / "tok").exists()


def test_build_all_only_tokenizer_name_trains_on_that_source_alone(tmp_path, monkeypatch, capsys):
    """--only tokenizer roam reads the roam export and nothing else: no hub stream is ever opened."""
    import importlib

    def no_hub(*args, **kwargs):
        raise AssertionError(f"a hub stream was opened: {args}")

    # the one place a `datasets` stream is opened
    monkeypatch.setattr(importlib.import_module("niels_gpt.sources.records"), "open_stream", no_hub)
    _ok(["build-all", "--cache-dir", str(tmp_path / "c"), "--only", "tokenizer", "roam", "--roam-dir",
         str(SAMPLE_DIR / "roam"), "--vocab-size", VOCAB, "--no-progress"], capsys)
    meta = read_meta(str(tmp_path / "c" / "tokenizer"))
    assert meta["trained_on"]["sources"] == ["roam"]
    assert read_meta(str(tmp_path / "c" / "pretrain" / "roam"))["tokenizer_sha256"] == meta["tokenizer_sha256"]


def test_the_tokenizer_rule_prefers_the_recorded_path_then_a_tokenizer_dir_above(tokenizer, tmp_path, capsys):
    """A recorded path that no longer holds the tokenizer falls back to tokenizer/ above; neither: None."""
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": f"document number {i} of a few"}) + "\n" for i in range(20)))
    tok_dir = tmp_path / "elsewhere"
    shutil.copytree(Path(tokenizer.model_path).parent, tok_dir)
    _ok(["build", str(src), "--out", str(tmp_path / "root" / "c"), "--tokenizer", str(tok_dir), "--no-progress"],
        capsys)
    assert tokenizer_of(tmp_path / "root" / "c").sha256 == tokenizer.sha256
    shutil.move(tok_dir, tmp_path / "root" / "tokenizer")  # moved beside the cache: still found
    assert tokenizer_of(tmp_path / "root" / "c").sha256 == tokenizer.sha256
    shutil.rmtree(tmp_path / "root" / "tokenizer")
    assert tokenizer_of(tmp_path / "root" / "c") is None
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "root" / "c")]) == 1
    assert "pass --tokenizer PATH" in capsys.readouterr().err


def test_build_names_its_own_flag_when_the_vocabulary_is_too_small_for_the_text(my_data, tmp_path, capsys):
    assert main(["build", str(my_data), "--out", str(tmp_path / "c" / "mine"), "--train-tokenizer", "262",
                 "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert "--train-tokenizer 262 is too small for this text" in err and "raise --train-tokenizer to" in err
    assert "--vocab-size" not in err and "--character-coverage" not in err
    assert not (tmp_path / "c" / "tokenizer" / "meta.json").exists()
