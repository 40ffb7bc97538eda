"""A dataset id asked to be shuffled is `load_dataset(id, streaming=True).shuffle(seed, buffer_size)` read in order,
as one piece, with no torch buffer on top; local files keep the builder's torch buffer.

The hub is out of reach here, so the "dataset" is three local JSON Lines shards read through the same `datasets`
calls (`load_dataset("json", data_files=..., streaming=True)`), put in place of the hub by patching
`records.open_stream`.
"""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest

from niels_gpt.builders.plan import make_plan
from niels_gpt.builders.run import BuildSpec, build
from niels_gpt.cache.cli import main
from niels_gpt.meta import read_meta
from niels_gpt.sources import records
from niels_gpt.sources.origins import read_table, split_rows
from niels_gpt.sources.records import Piece

SEED, BUFFER = 7, 8


@pytest.fixture
def hub(tmp_path, monkeypatch, real_docs):
    """Three shards of 20 documents each (paragraphs of the sample corpus, each marked with its number), and
    every dataset id opened as them; returns (shard files, the ids and kwargs opened)."""
    paras = [p.strip() for t in real_docs for p in t.split("\n\n") if len(p.strip()) > 40]
    files = []
    for s in range(3):
        f = tmp_path / "hub" / f"shard-{s}.jsonl"
        f.parent.mkdir(exist_ok=True)
        f.write_text("".join(json.dumps({"text": f"doc {s * 20 + i}: {paras[s * 20 + i][:200]}"}) + "\n"
                             for i in range(20)))
        files.append(f)
    opened = []

    def stream(item, what, **kw):
        opened.append((item, kw))
        return _local(files)

    monkeypatch.setattr(records, "open_stream", stream)
    return files, opened


def _local(files):
    return datasets.load_dataset("json", data_files=[str(f) for f in files], split="train", streaming=True)


def _expected(files, seed=SEED, buffer_size=BUFFER) -> list[str]:
    """The order the spec asks for: `datasets`' own shuffle of the stream."""
    return [row["text"] for row in _local(files).shuffle(seed=seed, buffer_size=buffer_size)]


def _tokens(cache, split, tokenizer) -> list[int]:
    return [int(t) for f in sorted((cache / split).glob("shard_*.bin"))
            for t in np.fromfile(f, dtype=tokenizer.token_dtype)]


def _stream_tokens(texts, tokenizer) -> list[int]:
    eot = tokenizer.special_ids["eot"]
    return [t for text in texts for t in [*tokenizer.encode(text), eot]]


def _tree(root) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_dataset_id_is_read_in_the_order_of_datasets_shuffle_and_built_twice_the_same(hub, tokenizer, tmp_path):
    files, opened = hub
    expected = _expected(files)
    natural = [json.loads(line)["text"] for f in files for line in f.read_text().splitlines()]
    assert expected != natural and sorted(expected) == sorted(natural)  # the shuffle moves documents
    logs: list[str] = []
    caches = []
    for run, executor in enumerate(("inline", "processes")):
        out = tmp_path / f"c{run}"
        build(BuildSpec(sources=["someone/web"], out=str(out), tokenizer=tokenizer.model_path, seed=SEED,
                        shuffle_buffer=BUFFER, executor=executor, workers=2, hf_config="cfg", split="train",
                        name="web"),
              log=logs.append)
        caches.append(out)
    assert _tokens(caches[0], "train", tokenizer) == _stream_tokens(expected, tokenizer)  # no torch buffer on top
    assert _tree(caches[0]) == _tree(caches[1])  # byte-identical, whichever executor was asked for
    assert len(logs) == 1 and "building inline" in logs[0]  # processes asked: inline, said in one line
    assert all(item == "someone/web" and kw["name"] == "cfg" and kw["split"] == "train" for item, kw in opened)
    meta = read_meta(str(caches[0]))
    assert meta["streaming"] is True and meta["source"]["streaming"] is True
    assert meta["source"]["shuffle"] == {
        "by": "datasets", "seed": SEED, "buffer_size": BUFFER,
        "call": f"load_dataset(..., streaming=True).shuffle(seed={SEED}, buffer_size={BUFFER}), read in order"}
    assert meta["build"]["shuffle_buffer"] is None  # the builder's torch buffer was not used
    # origins: the row's position in the shuffled stream, and origins.json says so
    table = json.loads((caches[0] / "origins.json").read_text())
    assert table["inputs"][0]["record"] == ("row of the stream as shuffled by datasets, from 0: load_dataset("
                                            "'someone/web', name='cfg', split='train', streaming=True)"
                                            f".shuffle(seed={SEED}, buffer_size={BUFFER})")
    rows = _rows(caches[0], "train")
    assert rows[:, 0].tolist() == [0] * 60 and rows[:, 1].tolist() == list(range(60))


def test_another_seed_or_buffer_is_another_order(hub, tokenizer, tmp_path):
    files, _ = hub
    out = tmp_path / "c"
    build(BuildSpec(sources=["someone/web"], out=str(out), tokenizer=tokenizer.model_path, seed=SEED + 1,
                    shuffle_buffer=BUFFER * 2, executor="inline"), log=lambda msg: None)
    expected = _expected(files, SEED + 1, BUFFER * 2)
    assert expected != _expected(files)
    assert _tokens(out, "train", tokenizer) == _stream_tokens(expected, tokenizer)


def test_build_all_fineweb_edu_from_the_hub_is_datasets_shuffle_in_order(hub, tokenizer, tmp_path):
    """build-all's fineweb_edu: --fineweb-buffer-size and --seed go to `datasets`' shuffle; val takes the first
    documents of the shuffled stream, train the rest, in order."""
    files, opened = hub
    root = tmp_path / "cache"
    assert main(["build-all", "--cache-dir", str(root), "--tokenizer", tokenizer.model_path, "--only", "fineweb_edu",
                 "--fineweb-dataset", "someone/web", "--fineweb-buffer-size", str(BUFFER), "--seed", str(SEED),
                 "--val-tokens", "300", "--no-progress"]) == 0
    cache = root / "pretrain" / "fineweb_edu"
    expected = _expected(files)
    val = _rows(cache, "val")[:, 1].tolist()
    train = _rows(cache, "train")[:, 1].tolist()
    assert val + train == list(range(60)) and 0 < len(val) < 60
    assert _tokens(cache, "train", tokenizer) == _stream_tokens(expected[len(val):], tokenizer)
    first = _stream_tokens(expected[:1], tokenizer)
    assert _tokens(cache, "val", tokenizer)[:len(first)] == first
    meta = read_meta(str(cache))
    assert meta["source"]["shuffle"]["seed"] == SEED and meta["source"]["shuffle"]["buffer_size"] == BUFFER
    assert meta["build"]["shuffle_buffer"] is None and meta["streaming"] is True
    assert {(item, kw["name"], kw["split"]) for item, kw in opened} == {("someone/web", "CC-MAIN-2024-10", "train")}


def test_local_files_keep_the_builders_torch_buffer(hub, tokenizer, tmp_path):
    """The same rows as local JSON Lines: the builder's seeded torch buffer, not `datasets`' shuffle."""
    files, opened = hub
    out = tmp_path / "c"
    build(BuildSpec(sources=[str(f) for f in files], out=str(out), tokenizer=tokenizer.model_path, seed=SEED,
                    shuffle_buffer=BUFFER, executor="inline"), log=lambda msg: None)
    meta = read_meta(str(out))
    assert meta["build"]["shuffle_buffer"] == BUFFER and "shuffle" not in meta["source"]
    assert meta["streaming"] is False and not opened
    assert _tokens(out, "train", tokenizer) != _stream_tokens(_expected(files), tokenizer)


def test_an_unshuffled_dataset_id_is_still_read_shard_by_shard(hub, tokenizer):
    """Without a shuffle a dataset id is one piece per shard, and its pieces' JSON (a task's id) has no
    shuffle fields."""
    plan = make_plan(["someone/web"], tokenizer=tokenizer)
    assert [t.pieces for t in plan.tasks] == [[{"item": "someone/web", "kind": "dataset", "start": s, "stop": 3,
                                                "config": None, "split": "train"}] for s in range(3)]
    shuffled = make_plan(["someone/web"], tokenizer=tokenizer, shuffle=(SEED, BUFFER))
    assert [t.pieces for t in shuffled.tasks] == [[{"item": "someone/web", "kind": "dataset", "start": 0, "stop": -1,
                                                    "config": None, "split": "train", "shuffle_seed": SEED,
                                                    "shuffle_buffer": BUFFER}]]
    assert Piece(**shuffled.tasks[0].pieces[0]).where() == f"someone/web shuffled (seed {SEED}, buffer {BUFFER})"


def _rows(cache, split):
    """The int64 [n, 4] origin rows of one split (input, record, char_start, char_end)."""
    table = read_table((cache / "origins.json").read_bytes(), str(cache / "origins.json"))
    return split_rows(np.load(cache / "origins.npy"), table, split)
