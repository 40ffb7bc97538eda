"""Builders for the loading tests: Parquet text shards from real text, tiny pretraining caches."""

from __future__ import annotations

from pathlib import Path

import pytest


def write_parquet(path: Path, texts: list[str], row_group_size: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": texts, "id": list(range(len(texts)))}), path, row_group_size=row_group_size)
    return path


@pytest.fixture(scope="session")
def doc_texts(real_docs) -> list[str]:
    """~300 real documents of varied length: the sample corpus cut at blank lines into 1-12 paragraphs."""
    paras = [p for t in real_docs for p in t.split("\n\n") if p.strip()]
    docs, i, n = [], 0, 0
    while i < len(paras) and len(docs) < 300:
        k = 1 + (n * 7) % 12  # lengths vary deterministically, so best-fit has real choices
        docs.append("\n\n".join(paras[i:i + k]))
        i, n = i + k, n + 1
    assert len(docs) >= 200
    return docs


@pytest.fixture(scope="session")
def parquet_dir(tmp_path_factory, doc_texts) -> Path:
    """Three shards, 100/100/rest documents, row groups of 16 rows (7 groups per full file)."""
    out = tmp_path_factory.mktemp("parquet")
    for i, lo in enumerate((0, 100, 200)):
        hi = lo + 100 if i < 2 else len(doc_texts)
        write_parquet(out / f"shard_{i:05d}.parquet", doc_texts[lo:hi], row_group_size=16)
    return out
