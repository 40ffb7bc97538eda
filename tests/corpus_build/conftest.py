"""A small corpus of real text in every file kind `build` reads, and the tokenizers of tokenizer_backends."""

from __future__ import annotations

import csv
import gzip
import json

import pytest

from ..conftest import sample_texts
from ..tokenizer_backends.conftest import bpe_json, hf_dir, tiktoken_file  # noqa: F401  (shared fixtures)


def docs(n: int = 12) -> list[str]:
    """Real paragraphs of the sample corpus."""
    paras = [p for t in sample_texts() for p in t.split("\n\n") if len(p.strip()) > 40]
    return paras[:n]


@pytest.fixture
def corpus_dir(tmp_path):
    """One document kind per file; returns (directory, documents in the order `build` reads them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    d = tmp_path / "corpus"
    d.mkdir()
    texts = docs(14)
    order = []
    (d / "a.jsonl").write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts[:3])))
    order += texts[:3]
    with gzip.open(d / "b.json.gz", "wt") as f:
        f.write("".join(json.dumps({"text": t}) + "\n" for t in texts[3:5]))
    order += texts[3:5]
    (d / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps({"text": t}) + "\n" for t in texts[5:7]).encode()))
    order += texts[5:7]
    with open(d / "d.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "n"])
        w.writerows([[t, i] for i, t in enumerate(texts[7:9])])
    order += texts[7:9]
    pq.write_table(pa.table({"text": texts[9:11]}), d / "e.parquet")
    order += texts[9:11]
    with pa.ipc.new_stream(d / "f.arrow", pa.schema([("text", pa.string())])) as w:
        w.write_table(pa.table({"text": texts[11:13]}))
    order += texts[11:13]
    (d / "g.md").write_text(texts[13])
    order += texts[13:14]
    (d / ".hidden.jsonl").write_text("not json\n")
    return d, order
