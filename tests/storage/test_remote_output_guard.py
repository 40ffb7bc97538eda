"""The output guard in a store (moto's S3 server): a prefix holding someone's objects is refused before any work,
an output of ours is replaced whole (the files it no longer has removed), and missing credentials end the build
before it starts, in one line."""

from __future__ import annotations

import json

from niels_gpt.cache.cli import main
from niels_gpt.report import verify_path

from ..conftest import sample_texts


def _data(tmp_path, n: int = 20):
    d = tmp_path / "data"
    d.mkdir(exist_ok=True)
    (d / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts()[:n] if t.strip()))
    return d


def _err(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: ") and sum("error: " in line for line in lines) == 1, lines
    return lines[-1]


def test_a_prefix_holding_someones_objects_is_refused_before_any_work(s3, tokenizer, tmp_path, capsys):
    fs, bucket = s3
    fs.pipe_file(f"{bucket[5:]}/mine/report.pdf", b"%PDF a user's file")
    capsys.readouterr()
    assert main(["build", str(_data(tmp_path)), "--out", f"{bucket}/mine", "--tokenizer", tokenizer.model_path,
                 "--no-progress"]) == 1
    line = _err(capsys)
    assert f"{bucket}/mine" in line and "report.pdf" in line and "not an output of this library" in line
    assert fs.cat_file(f"{bucket[5:]}/mine/report.pdf") == b"%PDF a user's file"
    assert fs.find(f"{bucket[5:]}/mine") == [f"{bucket[5:]}/mine/report.pdf"]


def test_an_output_of_ours_is_replaced_whole(s3, tokenizer, tmp_path, capsys):
    fs, bucket = s3
    argv = ["build", str(_data(tmp_path)), "--out", f"{bucket}/c", "--tokenizer", tokenizer.model_path,
            "--no-progress"]
    assert main([*argv, "--shard-bytes", "4KiB"]) == 0
    many = fs.find(f"{bucket[5:]}/c")
    assert main(argv) == 0  # one shard now: the old shards beyond it must go, or the cache would not verify
    few = fs.find(f"{bucket[5:]}/c")
    assert len(few) < len(many)
    capsys.readouterr()
    local = tmp_path / "mirror"
    fs.get(f"{bucket[5:]}/c/", str(local) + "/", recursive=True)
    assert verify_path(str(local)) == ([], 1)
    fs.pipe_file(f"{bucket[5:]}/c/notes.txt", b"mine")  # a file of the user's inside our output: refused
    assert main(argv) == 1
    assert "notes.txt" in _err(capsys) and fs.cat_file(f"{bucket[5:]}/c/notes.txt") == b"mine"


def test_missing_credentials_end_the_build_before_it_starts(s3, tokenizer, tmp_path, monkeypatch, capsys):
    import fsspec
    import s3fs

    fs, bucket = s3
    conf = dict(fsspec.config.conf["s3"])
    conf.pop("key"), conf.pop("secret")
    monkeypatch.setitem(fsspec.config.conf, "s3", conf)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    s3fs.S3FileSystem.clear_instance_cache()
    capsys.readouterr()
    assert main(["build", str(_data(tmp_path)), "--out", f"{bucket}/nocreds", "--tokenizer", tokenizer.model_path,
                 "--no-progress"]) == 1
    captured = capsys.readouterr()
    line = [x for x in captured.err.splitlines() if x.strip()][-1]
    assert f"{bucket}/nocreds" in line and "credentials" in line.lower()
    assert "built pretrain cache" not in captured.out and "tasks" not in captured.err  # refused before building
