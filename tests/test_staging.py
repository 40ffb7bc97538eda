"""One build per output at a time, built aside and swapped in: a second build fails fast naming the holder, a
dead builder's lock is taken over, a failed or refused step leaves the old output, readers never see a mix."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.cache.cli import main
from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.errors import ConfigError, OutputLockedError
from niels_gpt.staging import build_aside, output_lock, recover


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _build(out, tokenizer, docs):
    build_pretrain_cache(docs, str(out), tokenizer=tokenizer, max_train_tokens=10**6, max_val_tokens=0,
                         shard_bytes=1 << 20, seed=0, shuffle_buffer=None)


def test_a_second_build_of_the_same_output_fails_naming_the_holder(tmp_path, tokenizer, real_docs):
    out = tmp_path / "c"
    with output_lock(out):
        with pytest.raises(OutputLockedError, match=rf"another build holds .*c\.lock \(pid {os.getpid()} on "
                                                    rf"{socket.gethostname()}"):
            _build(out, tokenizer, real_docs[:3])
    assert not out.exists() and not (tmp_path / "c.lock").exists()
    _build(out, tokenizer, real_docs[:3])  # the lock went with its holder


def test_a_dead_builders_lock_is_taken_over_and_another_hosts_is_not(tmp_path, tokenizer, real_docs):
    out, lock = tmp_path / "c", tmp_path / "c.lock"
    lock.write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname(), "since": "then"}))
    _build(out, tokenizer, real_docs[:3])
    assert (out / "meta.json").is_file() and not lock.exists()
    lock.write_text(json.dumps({"pid": 1, "host": "another-host", "since": "then"}))
    with pytest.raises(OutputLockedError, match="on another-host .* remove the lock file"):
        _build(out, tokenizer, real_docs[:3])


def test_a_kill_between_the_two_renames_is_undone_by_the_next_build(tmp_path):
    out = tmp_path / "c"
    old = tmp_path / f"c.old-{dead_pid()}"
    old.mkdir()
    (old / "meta.json").write_text("{}")
    recover(out)
    assert (out / "meta.json").is_file() and not old.exists()


def test_an_open_reader_keeps_the_old_cache_and_a_new_one_sees_the_new(tmp_path, tokenizer, real_docs):
    out = tmp_path / "c"
    _build(out, tokenizer, real_docs[:4])
    old = PretrainTokenStreamDataset(str(out / "train"), T=32, device="cpu")
    before = old.get_batch(B=4, generator=torch.Generator().manual_seed(0))[0]
    _build(out, tokenizer, real_docs[4:9])  # rebuilt with other text while `old` is open
    again = old.get_batch(B=4, generator=torch.Generator().manual_seed(0))[0]
    assert torch.equal(before, again)  # the mapping still holds the old, complete files
    new = PretrainTokenStreamDataset(str(out / "train"), T=32, device="cpu")
    assert not torch.equal(new.get_batch(B=4, generator=torch.Generator().manual_seed(0))[0], before)


def test_output_paths_that_cannot_be_written_are_one_clear_error(tmp_path, tokenizer, real_docs):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match="a file, not a directory"):
        _build(tmp_path / "afile", tokenizer, real_docs[:2])
    with pytest.raises(ConfigError, match="a file, not a directory"):
        _build(tmp_path / "afile" / "c", tokenizer, real_docs[:2])
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        with pytest.raises(ConfigError, match="permission denied"):
            _build(ro / "c", tokenizer, real_docs[:2])


def test_build_aside_removes_its_stage_when_the_block_fails(tmp_path):
    with pytest.raises(RuntimeError):
        with build_aside(tmp_path / "c") as stage:
            (stage / "x").write_bytes(b"1")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_a_new_tokenizer_that_would_orphan_caches_is_refused_unless_asked(tmp_path, tokenizer, capsys):
    root = tmp_path / "c"
    args = ["--cache-dir", str(root), "--sample"]
    assert main(["build-all", *args, "--only", "roam", "--tokenizer", tokenizer.model_path]) == 0
    old_model = (root / "tokenizer" / "spm.model").read_bytes()
    assert main(["train-tokenizer", *args, "--vocab-size", "1500", "--tokenizer-max-chars", "1000000"]) == 1
    err = capsys.readouterr().err
    assert "these caches were built with: pretrain/roam" in err and "--replace-tokenizer" in err
    assert (root / "tokenizer" / "spm.model").read_bytes() == old_model  # untouched
    assert main(["train-tokenizer", *args, "--vocab-size", "1500", "--tokenizer-max-chars", "1000000", "--replace-tokenizer"]) == 0
    assert (root / "tokenizer" / "spm.model").read_bytes() != old_model


def test_a_tokenizer_json_is_copied_as_tokenizer_json(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from niels_gpt.builders.build_all import BuildConfig, build_tokenizer
    from niels_gpt.errors import TokenizerError
    from niels_gpt.tokenizer import load_tokenizer
    from niels_gpt.tokenizer.hf import add_special_tokens_to

    vocab = {"[UNK]": 0, "<s>": 1, "hello": 2, "world": 3}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "plain.json"))
    with pytest.raises(TokenizerError, match="special token"):  # refused before anything is written
        build_tokenizer(BuildConfig(cache_dir=str(tmp_path / "c"), tokenizer=str(tmp_path / "plain.json"),
                                    only=("tokenizer",)))
    assert not (tmp_path / "c" / "tokenizer").exists()
    add_special_tokens_to(tok)
    tok.save(str(tmp_path / "tokenizer.json"))
    build_tokenizer(BuildConfig(cache_dir=str(tmp_path / "c"), tokenizer=str(tmp_path / "tokenizer.json"),
                                only=("tokenizer",)))
    out = tmp_path / "c" / "tokenizer"
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "tokenizer.json"]
    assert load_tokenizer(out).encode("hello world") == [2, 3]
