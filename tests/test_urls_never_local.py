"""No command turns a URL into a local path: each one that writes local files refuses `s3://...` with a clear
error and leaves no `s3:` directory behind (convert's own test is in tests/formats/test_peer_semantics.py);
the builders that upload (build-all, the Python builders, pack-sft; tests/storage) refuse a scheme they
cannot write before building anything."""

import pytest

from niels_gpt.cache.cli import main

URL = "s3://bucket/out"


@pytest.mark.parametrize("args, flag", [
    (["train-tokenizer", "--sample", "--cache-dir", URL], "--cache-dir"),
    (["download", "--base-url", "http://127.0.0.1:9/x", "--out-dir", URL, "-n", "1"], "--out-dir"),
    (["train", "cache-demo/none", "--out-dir", URL], "--out-dir"),
])
def test_commands_that_write_local_files_refuse_a_url(args, flag, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"{flag} 's3://bucket/out' is a URL, but this writes local files only" in err
    assert not (tmp_path / "s3:").exists()


def test_build_refuses_a_url_it_cannot_write_before_building(tmp_path, monkeypatch, capsys, tokenizer):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.jsonl").write_text('{"text": "hello"}\n')
    assert main(["build", "a.jsonl", "--out", "nosuch://bucket/out", "--tokenizer", tokenizer.model_path]) == 1
    assert "the URL scheme 'nosuch' is not supported" in capsys.readouterr().err
    assert main(["build", "a.jsonl", "--out", "http://h/out", "--tokenizer", tokenizer.model_path]) == 1
    assert "http:// is read-only" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl"]  # nothing built, nothing at a URL-like path


def test_builders_refuse_a_url_they_cannot_write_and_write_nothing_locally(tmp_path, monkeypatch, tokenizer, capsys):
    from niels_gpt.cache.build_cache import build_pretrain_cache, build_sft_cache
    from niels_gpt.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    bad = "nosuch://bucket/out"
    with pytest.raises(ConfigError, match="nosuch://bucket/out: the URL scheme 'nosuch' is not supported"):
        build_pretrain_cache(["x"], bad, tokenizer=tokenizer, max_train_tokens=10, max_val_tokens=0,
                             shard_bytes=1 << 20, seed=0, shuffle_buffer=None)
    with pytest.raises(ConfigError, match="http://h/out: http:// is read-only"):
        build_sft_cache([], "http://h/out", tokenizer=tokenizer, val_frac=0.0, seed=0)
    assert main(["build-all", "--sample", "--only", "wikitext", "--cache-dir", bad]) == 1
    assert "the URL scheme 'nosuch' is not supported" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_train_names_a_url_data_argument(tmp_path, tmp_path_factory, monkeypatch, capsys):
    """train reads a cache URL through the download cache (docs/storage.md); a store it cannot reach is one
    line naming the URL, and nothing is written where it runs."""
    import fsspec

    from niels_gpt.storage import fs as storage_fs

    from .conftest import free_port

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(storage_fs, "BACKOFF_S", 0.01)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": f"http://127.0.0.1:{free_port()}", "key": "k",
                                                   "secret": "s"})  # nothing listens there
    downloads = tmp_path_factory.mktemp("downloads")
    assert main(["--network-timeout", "3", "train", "s3://bucket/cache/pretrain/wikitext", "--out-dir", "run",
                 "--local-cache", str(downloads)]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "s3://bucket/cache/pretrain/wikitext/meta.json" in err[0], err
    assert "(now 3 s)" in err[0]  # --local-cache kept the --network-timeout given before it
    assert list(tmp_path.iterdir()) == []
