"""Builders for the sources tests: tiny local files in the formats each source reads.

Fixtures hand out the builder functions (pytest's importlib mode cannot import conftest directly).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture
def write_jsonl():
    return _write_jsonl


@pytest.fixture
def write_parquet():
    return _write_parquet


@pytest.fixture
def shared_data() -> Path:
    """../shared/data, the real corpora; the test is skipped where it is absent (a user's clone)."""
    if not SHARED_DATA.exists():
        pytest.skip(f"{SHARED_DATA} is absent")
    return SHARED_DATA
