"""An OpenAssistant example traces to its tree and message ids, read again from the record its origin names:
from flat rows (Parquet) and from a tree export (JSON Lines), in Python and in `trace`'s output."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from niels_gpt.cache.cli import main
from niels_gpt.sources import SAMPLE_DIR
from niels_gpt.trace.documents import cache_documents, document_origin

ROWS = SAMPLE_DIR / "oasst1" / "oasst1-rows.parquet"
TREES = SAMPLE_DIR / "oasst1" / "oasst1-trees.jsonl"


def _messages() -> dict[str, dict]:
    """Every message of the sample by id (the flat rows: the same messages as the tree export)."""
    return {r["message_id"]: r for r in pq.read_table(ROWS).to_pylist()}


@pytest.fixture(scope="module")
def caches(tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("oasst")
    for name, src in (("rows", ROWS), ("trees", TREES)):
        assert main(["build", str(src), "--chat", "--out", str(out / name), "--tokenizer", tokenizer.model_path,
                     "--no-progress", "--executor", "inline", "--val-frac", "0.2"]) == 0
    return out


@pytest.mark.parametrize("name", ["rows", "trees"])
def test_each_oasst_example_names_its_tree_and_messages(caches, tokenizer, name):
    messages = _messages()
    cache = str(caches / name)
    for split in ("train", "val"):
        docs = cache_documents(cache, split)
        assert len(docs) > 0
        for i in range(len(docs)):
            origin = document_origin(cache, split, i)
            ids = origin["message_ids"]
            assert len(ids) >= 2 and ids[0] == origin["message_tree_id"]  # a tree's id is its root's
            chain = [messages[m] for m in ids]
            assert chain[0]["parent_id"] is None and all(
                b["parent_id"] == a["message_id"] and b["message_tree_id"] == origin["message_tree_id"]
                for a, b in zip(chain, chain[1:], strict=False))
            assert chain[-1]["role"] == "assistant"  # the leaf: the example ends with its answer
            text = tokenizer.decode(docs.tokens(*origin["cache_tokens"]).tolist())
            for m in chain:  # every message of the chain is in the example, in order
                head = " ".join(m["text"].split()[:6])
                assert head in " ".join(text.split()), (m["message_id"], head)


def test_flat_rows_and_the_tree_export_give_the_same_ids(caches):
    for split in ("train", "val"):
        n = len(cache_documents(str(caches / "rows"), split))
        got = [[document_origin(str(caches / k), split, i)["message_ids"] for i in range(n)] for k in ("rows", "trees")]
        assert got[0] == got[1]


def test_a_pretraining_or_dolly_document_has_no_message_ids(tokenizer, tmp_path):
    src = SAMPLE_DIR / "dolly15k" / "databricks-dolly-15k.first34.jsonl"
    assert main(["build", str(src), "--chat", "--out", str(tmp_path / "d"), "--tokenizer", tokenizer.model_path,
                 "--no-progress", "--executor", "inline"]) == 0
    origin = document_origin(str(tmp_path / "d"), "train", 0)
    assert origin["where"].endswith("line 1") and "message_ids" not in origin


@pytest.mark.parametrize("name", ["rows", "trees"])
def test_trace_prints_the_tree_and_messages_of_each_oasst_example(caches, tmp_path, capsys, name):
    from niels_gpt.train.train import TrainConfig, train

    run = tmp_path / "run"
    train(TrainConfig(data=str(caches / name), out_dir=str(run), depth=1, n_embd=32, n_head=2, sequence_len=64,
                      device_batch_size=2, steps=1, eval_steps=1, log_every=0), log=lambda *a: None)
    capsys.readouterr()
    assert main(["trace", str(run), "--step", "1", "--json"]) == 0
    docs = [d for q in json.loads(capsys.readouterr().out)["sequences"] for d in q["documents"]]
    assert docs and all(d["message_ids"] for d in docs)
    assert main(["trace", str(run), "--step", "1"]) == 0
    out = capsys.readouterr().out
    for d in docs:
        assert f"tree {d['message_tree_id']}, messages {' '.join(d['message_ids'])}" in out
