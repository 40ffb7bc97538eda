"""No input is left out in silence: every file under a source is read or listed (plan, summary, meta.json's
`skipped_inputs`), and a file of another suffix can be read (--read-as SUFFIX=KIND, --format text)."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import zstandard

from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta
from niels_gpt.tokenizer import load_tokenizer

from .conftest import docs

pytest.importorskip("tokenizers")


def tokens(out) -> list[int]:
    return np.concatenate([np.fromfile(p, dtype="<u2") for p in sorted((out / "train").glob("shard_*.bin"))]).tolist()


@pytest.fixture
def books(tmp_path):
    d = tmp_path / "books"
    d.mkdir()
    texts = docs(4)
    (d / "a.txt").write_text(texts[0])
    (d / "gcide.dict").write_text(texts[1])
    (d / ".notes.txt").write_text("hidden")
    return d, texts


def build(tmp_path, *args, name="c"):
    return main(["build", *map(str, args), "--out", str(tmp_path / name), "--no-progress"])


def test_a_file_of_an_unknown_kind_is_listed_in_the_plan_the_summary_and_meta(tmp_path, books, bpe_json, capsys):
    d, texts = books
    assert build(tmp_path, d, "--tokenizer", bpe_json, "--plan-only") == 0
    plan = capsys.readouterr().out
    assert "gcide.dict: unknown file kind '.dict'" in plan and "--read-as .dict=text" in plan
    assert ".notes.txt: a hidden file" in plan
    assert build(tmp_path, d, "--tokenizer", bpe_json) == 0
    summary = capsys.readouterr().out
    assert "left out 2 file(s) under the sources" in summary and "gcide.dict" in summary
    meta = read_meta(str(tmp_path / "c"))
    left = {p.rsplit("/", 1)[-1]: why for p, why in ((e["path"], e["reason"]) for e in meta["skipped_inputs"])}
    assert sorted(left) == [".notes.txt", "gcide.dict"] and "--format text" in left["gcide.dict"]
    tok = load_tokenizer(bpe_json)
    assert tokens(tmp_path / "c") == tok.encode(texts[0]) + [tok.separator.id]


def test_read_as_and_format_text_read_the_file_and_only_the_hidden_one_stays_out(tmp_path, books, bpe_json):
    d, texts = books
    tok = load_tokenizer(bpe_json)
    want = [i for t in texts[:2] for i in tok.encode(t) + [tok.separator.id]]
    for name, flags in (("r", ["--read-as", ".dict=text"]), ("f", ["--format", "text"])):
        assert build(tmp_path, d, "--tokenizer", bpe_json, *flags, name=name) == 0
        assert tokens(tmp_path / name) == want
        meta = read_meta(str(tmp_path / name))
        assert [e["path"].rsplit("/", 1)[-1] for e in meta["skipped_inputs"]] == [".notes.txt"]


def test_a_cache_of_files_all_read_is_unchanged_and_has_no_skipped_inputs(tmp_path, bpe_json):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_text(docs(1)[0])
    assert build(tmp_path, d, "--tokenizer", bpe_json) == 0
    assert "skipped_inputs" not in read_meta(str(tmp_path / "c"))


def test_compressed_text_files_are_read_like_their_plain_kinds(tmp_path, bpe_json):
    texts = docs(3)
    d = tmp_path / "z"
    d.mkdir()
    (d / "a.txt.gz").write_bytes(gzip.compress(texts[0].encode()))
    (d / "b.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(texts[1].encode()))
    (d / "c.md.gz").write_bytes(gzip.compress(texts[2].encode()))
    assert build(tmp_path, d, "--tokenizer", bpe_json) == 0
    tok = load_tokenizer(bpe_json)
    assert tokens(tmp_path / "c") == [i for t in texts for i in tok.encode(t) + [tok.separator.id]]
    assert "skipped_inputs" not in read_meta(str(tmp_path / "c"))
