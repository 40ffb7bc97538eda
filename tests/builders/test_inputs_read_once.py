"""What a build reads is what the cache holds: a truncated compressed file is an error, an input rewritten while it
is read is refused, a receipt is reused only for the same bytes, a separator that occurs in the text is refused."""

from __future__ import annotations

import gzip
import json
import os
import re

import pytest

from niels_gpt.builders.run import BuildSpec, build
from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta
from niels_gpt.errors import ConfigError, SourceError

from ..conftest import sample_texts


def _rows(n: int, tag: str = "") -> bytes:
    texts = [p for t in sample_texts() for p in t.split("\n\n") if len(p.strip()) > 40][:n]
    return "".join(json.dumps({"text": tag + t}) + "\n" for t in texts).encode()


def _one_line_error(argv, capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and sum("error: " in line for line in lines) == 1, lines
    return lines[-1]


@pytest.mark.parametrize("frames", [1, 3])
@pytest.mark.parametrize("skip", [False, True], ids=["error", "skip-bad-records"])
def test_a_truncated_zstd_file_is_an_error_naming_it(tmp_path, tokenizer, capsys, frames, skip):
    import zstandard

    data = _rows(60)
    cut = len(data) // frames
    blob = b"".join(zstandard.ZstdCompressor().compress(data[i * cut:(i + 1) * cut if i < frames - 1 else None])
                    for i in range(frames))
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "docs.jsonl.zst").write_bytes(blob[: len(blob) * 2 // 3])
    line = _one_line_error(["build", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--tokenizer",
                            tokenizer.model_path, "--no-progress", *(["--on-bad-record", "skip"] if skip else [])],
                           capsys)
    assert "docs.jsonl.zst" in line and "truncated" in line
    assert not (tmp_path / "out").exists()


def test_a_truncated_gzip_file_is_an_error_naming_it(tmp_path, tokenizer, capsys):
    blob = gzip.compress(_rows(60))
    (tmp_path / "docs.jsonl.gz").write_bytes(blob[: len(blob) // 2])
    line = _one_line_error(["build", str(tmp_path / "docs.jsonl.gz"), "--out", str(tmp_path / "out"), "--tokenizer",
                            tokenizer.model_path, "--no-progress"], capsys)
    assert "docs.jsonl.gz" in line and "truncated" in line


def _spec(tmp_path, tokenizer, src, **kw) -> BuildSpec:
    return BuildSpec(sources=[str(src)], out=str(tmp_path / "out"), tokenizer=tokenizer, name="same", **kw)


@pytest.mark.parametrize("executor", ["inline", "inprocess"])
@pytest.mark.parametrize("keep_times", [False, True], ids=["plain-write", "size-and-mtime-put-back"])
def test_an_input_rewritten_while_it_is_read_is_refused(tmp_path, tokenizer, monkeypatch, executor, keep_times):
    import niels_gpt.sources.stream as stream

    src = tmp_path / "docs.jsonl"
    src.write_bytes(_rows(40))
    original = stream.records

    def records_then_rewrite(piece, columns=None):
        for k, rec in enumerate(original(piece, columns)):
            yield rec
            if k == 0:  # another program rewrites the file while the build is reading it
                st = os.stat(src)
                data = src.read_bytes()
                src.write_bytes(data.replace(b"the", b"THE") if keep_times else data + _rows(2, "new: "))
                if keep_times:
                    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))

    monkeypatch.setattr(stream, "records", records_then_rewrite)
    with pytest.raises(SourceError, match=r"docs\.jsonl: changed while it was read .*the build is refused"):
        build(_spec(tmp_path, tokenizer, src, executor=executor), log=lambda m: None)
    assert not (tmp_path / "out").exists()


def test_a_receipt_is_reused_only_for_the_same_bytes(tmp_path, tokenizer):
    """An input edited with its size and mtime kept: its task runs again (its receipt named other bytes)."""
    src = tmp_path / "docs.jsonl"
    src.write_bytes(_rows(80))
    spec = _spec(tmp_path, tokenizer, src, executor="inprocess", task_bytes=8_000, keep_parts=True)
    first = build(spec, log=lambda m: None)
    assert first["ran"] == first["tasks"] > 3
    st = os.stat(src)
    data = bytearray(src.read_bytes())
    at = data.rindex(b"the")
    data[at:at + 3] = b"THE"  # one word of the last task's range, same size
    src.write_bytes(bytes(data))
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    second = build(spec, log=lambda m: None)
    assert (second["ran"], second["reused"]) == (1, first["tasks"] - 1)
    fresh = build(BuildSpec(sources=[str(src)], out=str(tmp_path / "fresh"), tokenizer=tokenizer, name="same",
                            executor="inline"), log=lambda m: None)
    assert fresh["totals"] == second["totals"]
    assert sorted((tmp_path / "out" / "train").glob("*.bin"))[0].read_bytes() == \
        sorted((tmp_path / "fresh" / "train").glob("*.bin"))[0].read_bytes()


def test_a_separator_that_occurs_in_the_text_is_refused(tmp_path, bpe_json, capsys):
    from niels_gpt.tokenizer import load_tokenizer

    tok = load_tokenizer(bpe_json)
    src = tmp_path / "docs.jsonl"
    src.write_bytes(_rows(30))
    word = tok.encode(" the")
    assert len(word) == 1
    for executor in ("inline", "processes"):
        line = _one_line_error(["build", str(src), "--out", str(tmp_path / "out"), "--tokenizer", str(bpe_json),
                                "--eos", str(word[0]), "--executor", executor, "--task-bytes", "4000",
                                "--no-progress"], capsys)
        assert re.search(r"document \d+: the document separator", line), line
        assert f"separator (id {word[0]}) occurs inside its text" in line and "--eos" in line, line
        assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="occurs inside its text"):
        build(BuildSpec(sources=[str(src)], out=str(tmp_path / "out"), tokenizer=bpe_json, bos=str(word[0]),
                        separator="bos", executor="inline"), log=lambda m: None)
    meta = build(BuildSpec(sources=[str(src)], out=str(tmp_path / "ok"), tokenizer=bpe_json), log=lambda m: None)
    assert meta["totals"]["train_documents"] == read_meta(str(tmp_path / "ok"))["totals"]["train_documents"] > 0
