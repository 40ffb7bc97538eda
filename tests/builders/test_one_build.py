"""One `build` for every executor over one input layer: an odd folder gives byte-identical caches inline, on one
local process and on two (Ray: tests/builders/test_ray_build.py), for pretraining and chat; the written text
rules (docs/own-data.md); the library's layouts reachable from `build`; `dist-build` is gone."""

from __future__ import annotations

import collections
import csv
import gzip
import json
import os

import pytest

from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta
from niels_gpt.sources import SAMPLE_DIR

from ..conftest import sample_texts

LONG_LINE_MB = int(os.environ.get("NIELS_GPT_TEST_LONG_LINE_MB", "50"))


def _tree(path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _paragraphs(n: int) -> list[str]:
    paras = [p for t in sample_texts() for p in t.split("\n\n") if len(p.strip()) > 40]
    return paras[:n]


@pytest.fixture(scope="module")
def odd_folder(tmp_path_factory):
    """Every input kind and every text rule at once: nested directories, .txt .md .jsonl .json.gz .jsonl.zst
    .parquet (several row groups) .csv .arrow, a UTF-8 BOM (opening a JSONL file and opening a text), CRLF,
    a null text, an empty file, an empty string, non-ASCII, and one line of LONG_LINE_MB megabytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    root = tmp_path_factory.mktemp("odd") / "corpus"
    (root / "a" / "b").mkdir(parents=True)
    texts = _paragraphs(60)
    rows = lambda lo, hi: "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts[lo:hi])  # noqa: E731
    (root / "a" / "b" / "deep.jsonl").write_bytes(b"\xef\xbb\xbf" + rows(0, 5).encode())  # a BOM opens the file
    (root / "a" / "notes.md").write_bytes(("\ufeff" + texts[5].replace("\n", "\r\n")).encode())  # BOM + CRLF
    (root / "a" / "plain.txt").write_text("Ünïcödé — naïve café, 東京, emoji 🙂\n" + texts[6])
    (root / "empty.txt").write_text("")
    with gzip.open(root / "b.json.gz", "wt", encoding="utf-8") as f:
        f.write(rows(7, 10) + json.dumps({"text": None}) + "\n" + json.dumps({"text": ""}) + "\n")
    (root / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        (rows(10, 14) + json.dumps({"text": "\ufeffa text that opens with a BOM\r\nand has CRLF"}) + "\n").encode()))
    pq.write_table(pa.table({"text": texts[14:40] + [None]}), root / "d.parquet", row_group_size=5)
    with open(root / "e.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "n"])
        w.writerows([[t, i] for i, t in enumerate(texts[40:45])])
    with pa.ipc.new_file(root / "f.arrow", pa.schema([("text", pa.string())])) as w:
        for lo in (45, 48, 51):
            w.write_table(pa.table({"text": texts[lo:lo + 3]}))
    word = "tokens of one very long line "
    (root / "g.jsonl").write_text(json.dumps({"text": word * (LONG_LINE_MB * (1 << 20) // len(word))}) + "\n"
                                  + rows(54, 60))
    return root


def _build(src, out, tok, *extra):
    assert main(["build", str(src), "--out", str(out), "--tokenizer", str(tok), "--name", "same", "--no-progress",
                 *extra]) == 0
    return _tree(out)


def test_the_odd_folder_is_byte_identical_for_every_executor_and_worker_count(odd_folder, tokenizer, tmp_path):
    common = ["--val-tokens", "3000", "--shard-bytes", "64KiB", "--task-bytes", "200000"]
    ref = _build(odd_folder, tmp_path / "inline", tokenizer.model_path, *common, "--executor", "inline",
                 "--workers", "1")
    assert len(ref) > 5
    for executor, workers in (("inline", "2"), ("processes", "1"), ("processes", "2")):
        out = tmp_path / f"{executor}-{workers}"
        assert _build(odd_folder, out, tokenizer.model_path, *common, "--executor", executor,
                      "--workers", workers) == ref, (executor, workers)
    meta = json.loads(ref["meta.json"])
    assert meta["skipped"] == {"empty_document": 2, "null_text": 2}  # the empty file and string; two nulls
    assert meta["totals"]["train_documents"] + meta["totals"]["val_documents"] == 60 + 2  # + the BOM text, unicode


def test_the_text_rules_reach_the_tokens(odd_folder, tokenizer, tmp_path):
    """docs/own-data.md: BOM dropped (at a file's start and a text's), CRLF -> LF, non-ASCII kept as is."""
    import numpy as np

    _build(odd_folder, tmp_path / "c", tokenizer.model_path, "--executor", "inline")
    ids = np.concatenate([np.fromfile(p, dtype="<u2") for p in sorted((tmp_path / "c" / "train").glob("*.bin"))])
    text = tokenizer.decode(ids.tolist())
    assert "\ufeff" not in text and "\r" not in text
    assert "a text that opens with a BOM\nand has CRLF" in text and "Ünïcödé — naïve café, 東京, emoji 🙂" in text


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("chats") / "chats"
    (root / "nested").mkdir(parents=True)
    texts = _paragraphs(400)
    convs = [{"messages": [{"role": "user", "content": texts[i]}, {"role": "assistant", "content": texts[i + 1]}]}
             for i in range(0, 400, 2)]
    convs[7] = {"messages": [{"role": "user", "content": "a question nobody answers"}]}
    (root / "nested" / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(c) + "\n" for c in convs[:120]).encode())
    pq.write_table(pa.table({"messages": [c["messages"] for c in convs[120:]]}), root / "b.parquet", row_group_size=16)
    return root


@pytest.mark.parametrize("template", [False, True], ids=["sentinels", "chat-template"])
def test_chat_builds_are_byte_identical_for_every_executor(chat_folder, tokenizer, hf_dir, tmp_path, template):
    tok = hf_dir if template else tokenizer.model_path
    common = ["--chat", "--val-frac", "0.2", "--task-bytes", "30000"]
    ref = _build(chat_folder, tmp_path / "inline", tok, *common, "--executor", "inline", "--workers", "1")
    for executor, workers in (("inline", "2"), ("processes", "1"), ("processes", "2")):
        assert _build(chat_folder, tmp_path / f"{executor}{workers}", tok, *common, "--executor", executor,
                      "--workers", workers) == ref, (executor, workers)
    meta = json.loads(ref["meta.json"])
    assert meta["skipped"] == {"no_assistant_turn": 1}
    assert meta["totals"]["train_examples"] + meta["totals"]["val_examples"] == 199


def test_build_makes_no_val_split_unless_asked_and_dist_build_is_gone(odd_folder, tokenizer, tmp_path, capsys):
    """The folder that made two verbs disagree (.md and .jsonl.gz left out, a BOM kept, a null counted as empty):
    one verb now, with no val split unless asked; the old verb's name is an unknown command."""
    a = _build(odd_folder, tmp_path / "build", tokenizer.model_path)
    assert json.loads(a["meta.json"])["totals"]["val_tokens"] == 0
    with pytest.raises(SystemExit) as exc:
        main(["dist-build", str(odd_folder), "--out", str(tmp_path / "dist"), "--tokenizer", tokenizer.model_path])
    assert exc.value.code == 2 and "invalid choice: 'dist-build'" in capsys.readouterr().err
    assert not (tmp_path / "dist").exists()


def test_the_librarys_layouts_are_reachable_from_build(tokenizer, tmp_path):
    """A Gutenberg book loses its licence text, a raw wikitext dump becomes articles, dolly rows and oasst trees
    (both export shapes) become conversations, detected from the records or named with --format."""
    from niels_gpt.sources.layouts import gutenberg_books, rebuild_articles
    from niels_gpt.sources.text_io import read_text_file

    book = SAMPLE_DIR / "gutenberg"
    _build(book, tmp_path / "pg", tokenizer.model_path, "--executor", "inline")
    meta = read_meta(str(tmp_path / "pg"))
    assert meta["source"]["layouts"] == ["gutenberg"]
    books = sorted(book.glob("*.txt"))
    expected = sum(len(tokenizer.encode(b)) + 1 for p in books for b in gutenberg_books(read_text_file(p), p))
    assert meta["totals"]["train_tokens"] == expected
    raw = SAMPLE_DIR / "wikitext" / "wiki.valid.raw"
    _build(raw, tmp_path / "wiki", tokenizer.model_path, "--executor", "inline")
    articles = list(rebuild_articles(read_text_file(raw).split("\n"), collections.Counter()))
    assert read_meta(str(tmp_path / "wiki"))["totals"]["train_documents"] == len(articles)
    dolly = SAMPLE_DIR / "dolly15k" / "databricks-dolly-15k.first34.jsonl"
    _build(dolly, tmp_path / "dolly", tokenizer.model_path, "--chat", "--executor", "inline")
    assert read_meta(str(tmp_path / "dolly"))["source"]["layouts"] == ["dolly"]
    trees = SAMPLE_DIR / "oasst1" / "oasst1-trees.jsonl"
    _build(trees, tmp_path / "oasst", tokenizer.model_path, "--chat", "--executor", "inline")
    _build(trees, tmp_path / "oasst-named", tokenizer.model_path, "--chat", "--format", "oasst", "--executor", "inline")
    assert read_meta(str(tmp_path / "oasst"))["totals"]["train_examples"] > 0
    rows = SAMPLE_DIR / "oasst1" / "oasst1-rows.parquet"
    _build(rows, tmp_path / "oasst-rows", tokenizer.model_path, "--chat", "--executor", "inline")
    a, b = read_meta(str(tmp_path / "oasst")), read_meta(str(tmp_path / "oasst-rows"))
    assert a["totals"] == b["totals"]  # the two export shapes of the same trees: the same conversations


def test_compressed_shards_are_the_same_on_every_executor(tokenizer, tmp_path):
    """--compress zstd goes through the one build: inline and on processes write the same frames and index."""
    src = SAMPLE_DIR / "roam"
    common = ["--compress", "zstd", "--val-tokens", "2000", "--shard-bytes", "16KiB", "--task-bytes", "20000"]
    inline = _build(src, tmp_path / "inline", tokenizer.model_path, *common, "--executor", "inline")
    assert _build(src, tmp_path / "processes", tokenizer.model_path, *common, "--executor", "processes",
                  "--workers", "2") == inline
    assert any(name.endswith(".bin.zst") for name in inline)
    assert json.loads(inline["meta.json"])["compression"]["codec"] == "zstd"
