"""build-all's caches are `build`s, so each has origins: every document of the sample corpus's caches traces back
to its input record (a roam note's characters, a wikitext article's heading, a dolly line, an oasst tree); a
dataset id's shard and row; the hub's wikitext line rows give the raw file's articles."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from niels_gpt.builders.origins import SHARD_SHIFT
from niels_gpt.builders.run import BuildSpec, build
from niels_gpt.cache.cli import main
from niels_gpt.meta import read_meta
from niels_gpt.sources import SAMPLE_DIR
from niels_gpt.sources.layouts import normalise_line
from niels_gpt.sources.origins import read_table
from niels_gpt.sources.text_io import normalise_text
from niels_gpt.trace.documents import cache_documents, read_origins


@pytest.fixture(scope="module")
def demo(tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    assert main(["build-all", "--cache-dir", str(root), "--sample", "--tokenizer", tokenizer.model_path, "--only",
                 "roam", "wikitext", "dolly15k", "oasst1", "--no-progress"]) == 0
    return root


def _input(entry: dict) -> str:
    assert entry["path"].startswith("sample:")
    return str(SAMPLE_DIR / entry["path"][len("sample:"):])


def _span(idx, i, tokens) -> slice:
    """Example i of an SFT split: from its start to the next one's (the last: to the end)."""
    return slice(int(idx[i]), int(idx[i + 1]) if i + 1 < len(idx) else len(tokens))


def _origins(cache, split):
    rows, inputs = read_origins(Path(cache), read_meta(str(cache)), split)
    return rows, {"inputs": inputs}


@pytest.mark.parametrize("split", ["train", "val"])
def test_every_roam_and_wikitext_document_traces_back_to_its_characters(demo, tokenizer, split):
    for name in ("roam", "wikitext"):
        cache = demo / "pretrain" / name
        docs = cache_documents(str(cache), split)
        rows, table = _origins(cache, split)
        assert len(rows) == len(docs) > 0
        found = 0
        for i, (k, record, a, b) in enumerate(rows.tolist()):
            text = normalise_text(open(_input(table["inputs"][k]), encoding="utf-8").read())
            assert record == 0  # a whole file
            got = docs.tokens(*docs.origin(i)["cache_tokens"]).tolist()
            if name == "roam":  # a note is its file
                assert got[:-1] == tokenizer.encode(text[a:b]) and got[-1] == tokenizer.eot_id
            elif a >= 0:  # an article starts at its heading (-1: a heading whose markers were undone)
                assert b == -1 and text[a:].startswith(tokenizer.decode(got[:12]).split("\n")[0])
            found += a >= 0
        assert found >= 0.9 * len(rows)
    roam = read_meta(str(demo / "pretrain" / "roam"))
    assert roam["origins"] and sorted(roam["source"]["val_files"]) == sorted(
        e["path"] for e in json.loads((demo / "pretrain/roam/origins.json").read_text())["inputs"][len(
            roam["source"]["files"]):])


def test_dolly_and_oasst_examples_trace_back_to_their_line_and_tree(demo, tokenizer):
    for split in ("train", "val"):
        cache = demo / "sft" / "dolly15k"
        rows, table = _origins(cache, split)
        tokens = np.fromfile(cache / f"{split}_tokens.bin", dtype=tokenizer.token_dtype)
        idx = np.load(cache / f"{split}_idx.npy")
        assert len(rows) == len(idx) > 0
        path = _input(table["inputs"][0])
        for i, (_, offset, _, _) in enumerate(rows.tolist()):
            with open(path, "rb") as f:
                f.seek(offset)
                record = json.loads(f.readline())
            text = tokenizer.decode(tokens[_span(idx, i, tokens)].tolist())
            assert record["response"].strip()[:40] in text
    # oasst1: a conversation's record is its tree's first row; that row names the tree (message_tree_id)
    cache = demo / "sft" / "oasst1"
    rows, table = _origins(cache, "train")
    assert table["inputs"][0]["kind"] == ".parquet"
    flat = pq.read_table(_input(table["inputs"][0])).to_pylist()
    tokens = np.fromfile(cache / "train_tokens.bin", dtype=tokenizer.token_dtype)
    idx = np.load(cache / "train_idx.npy")
    trees = []
    for i, (_, row, _, _) in enumerate(rows.tolist()):
        root = flat[row]
        assert root["parent_id"] is None  # the tree's first row is its prompt
        trees.append(root["message_tree_id"])
        assert root["text"].strip()[:30] in tokenizer.decode(tokens[_span(idx, i, tokens)].tolist())
    assert len(set(trees)) == len(trees)  # one conversation per tree
    assert read_meta(str(cache))["skipped"]["unselected_message"] == 189  # build-all's account of each tree


def test_a_hub_dataset_shard_is_an_origins_input_with_its_shard_and_row(tokenizer, tmp_path, monkeypatch):
    """A dataset id read through `datasets` (here its two shards are local JSON Lines files): each example's
    record is shard << 40 | row of the shard."""
    import datasets

    from niels_gpt.sources import records

    lines = (SAMPLE_DIR / "dolly15k" / "databricks-dolly-15k.first34.jsonl").read_text().splitlines(keepends=True)
    files = [tmp_path / "part-0.jsonl", tmp_path / "part-1.jsonl"]
    files[0].write_text("".join(lines[:20]))
    files[1].write_text("".join(lines[20:]))
    opened = []

    def stream(item, what, **kw):
        opened.append((item, kw.get("split")))
        return datasets.load_dataset("json", data_files=[str(f) for f in files], split="train", streaming=True)

    monkeypatch.setattr(records, "open_stream", stream)
    out = tmp_path / "c"
    build(BuildSpec(sources=["someone/dolly"], out=str(out), tokenizer=tokenizer.model_path, chat=True, layout="dolly",
                    val_frac=0.2, executor="inline"), log=lambda msg: None)
    assert opened and all(item == "someone/dolly" and split == "train" for item, split in opened)
    assert read_meta(str(out))["streaming"] is True  # a dataset id is streamed
    table = read_table((out / "origins.json").read_bytes(), "origins.json")
    assert table["inputs"] == [{"kind": "dataset", "path": "someone/dolly", "record": "shard << 40 | row of the shard",
                                "sha256": "dataset:someone/dolly:None:train"}]
    seen = []
    for split in ("train", "val"):
        rows, _ = _origins(out, split)
        tokens = np.fromfile(out / f"{split}_tokens.bin", dtype=tokenizer.token_dtype)
        idx = np.load(out / f"{split}_idx.npy")
        for i, (_, record, _, _) in enumerate(rows.tolist()):
            shard, row = record >> SHARD_SHIFT, record & ((1 << SHARD_SHIFT) - 1)
            source = json.loads(files[shard].read_text().splitlines()[row])
            assert source["response"].strip()[:40] in tokenizer.decode(tokens[_span(idx, i, tokens)].tolist())
            seen.append((shard, row))
    assert {s for s, _ in seen} == {0, 1} and len(set(seen)) == len(seen) == 34


def test_wikitext_from_the_hub_rows_is_the_raw_files_articles(tokenizer, tmp_path, monkeypatch):
    """build-all's wikitext from its dataset id: line rows of each split (the hub's schema; here `datasets`
    reads local files of it), rebuilt into the same articles as the raw files, with origins at each heading."""
    import datasets

    from niels_gpt.sources import records

    raw = {"train": SAMPLE_DIR / "wikitext" / "wiki.train.raw", "validation": SAMPLE_DIR / "wikitext" / "wiki.valid.raw"}
    rows = {}
    for split, path in raw.items():
        rows[split] = tmp_path / f"{split}.jsonl"
        rows[split].write_text("".join(json.dumps({"text": line}) + "\n"
                                       for line in path.read_text(encoding="utf-8").splitlines(keepends=True)))

    def stream(item, what, **kw):
        assert item == "someone/wiki" and kw["name"] == "raw"
        return datasets.load_dataset("json", data_files=str(rows[kw["split"]]), split="train", streaming=True)

    monkeypatch.setattr(records, "open_stream", stream)
    common = ["--tokenizer", tokenizer.model_path, "--only", "wikitext", "--no-progress"]
    assert main(["build-all", "--cache-dir", str(tmp_path / "hub"), "--wikitext-dataset", "someone/wiki",
                 "--wikitext-config", "raw", *common]) == 0
    assert main(["build-all", "--cache-dir", str(tmp_path / "raw"), "--wikitext-train-file", str(raw["train"]),
                 "--wikitext-val-file", str(raw["validation"]), *common]) == 0
    hub, files = tmp_path / "hub" / "pretrain" / "wikitext", tmp_path / "raw" / "pretrain" / "wikitext"
    for split in ("train", "val"):
        assert (hub / split / "shard_00000.bin").read_bytes() == (files / split / "shard_00000.bin").read_bytes()
        heads, table = _origins(hub, split)
        assert table["inputs"][heads[0][0]]["sha256"] == f"dataset:someone/wiki:raw:{'train' if split == 'train' else 'validation'}"
        lines = raw["train" if split == "train" else "validation"].read_text(encoding="utf-8").splitlines()
        docs = cache_documents(str(hub), split)
        for i, (_, row, a, _) in enumerate(heads.tolist()):
            assert lines[row].strip().startswith("= ") and (a >= 0 or " @" in lines[row])  # the article's heading row
            first = tokenizer.decode(docs.tokens(*docs.origin(i)["cache_tokens"])[:40].tolist())
            assert first.startswith(normalise_line(lines[row])[:10])
    meta = read_meta(str(hub))
    assert meta["source"]["val_split"] == "validation" and meta["skipped"] == read_meta(str(files))["skipped"]


def test_origins_fields_are_the_narrowest_ints_unsigned_where_nothing_is_negative():
    from niels_gpt.sources.origins import compact_dtype

    rows = np.array([[0, 200, -1, -1], [255, 40_000, -1, -1]], dtype=np.int64)
    assert compact_dtype(rows).descr == [("input", "|u1"), ("record", "<u2")]  # 1 + 2 bytes a row, not 2 + 4
    rows = np.array([[0, 0, -1, 70_000], [1, 5_000_000_000, 3, 80_000]], dtype=np.int64)
    assert compact_dtype(rows).descr == [("input", "|u1"), ("record", "<u8"), ("char_start", "|i1"),
                                         ("char_end", "<u4")]


def test_a_field_the_same_for_every_document_is_kept_once_in_the_table_not_in_each_row():
    from niels_gpt.sources.origins import as_rows, compact_dtype, constants

    rows = np.array([[0, 865, -1, -1], [0, 1300, -1, -1], [0, 2643, -1, -1]], dtype=np.int64)
    same = constants(rows)
    assert same == {"input": 0}  # one input; no char range (-1) is neither stored nor a constant
    assert compact_dtype(rows, same).descr == [("record", "<u2")]  # 2 bytes a row, not 3
    arr = np.zeros(3, compact_dtype(rows, same))
    arr["record"] = rows[:, 1]
    assert as_rows(arr, same).tolist() == rows.tolist()
