"""Inputs for the parallel-build tests: real text from the sample corpus in every input kind.

`corpus` writes a JSONL file (with empty, whitespace and null documents and a blank line), a Parquet
file of 9-row row groups (with nulls), and three .txt files (one of them whitespace only), and hands
back the paths with the documents exactly as a one-process build reads them (a null text as
Skipped("null_text"), the text rules applied), decoded here independently of niels_gpt.sources. `build_reference` runs build_pretrain_cache on those documents;
`tree` maps every file of a cache to its bytes (the work directory left out).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.sources.documents import Skipped
from niels_gpt.tokenizer.find import recorded_path

from ..tokenizer_backends.conftest import bpe_json, hf_dir  # noqa: F401  (shared fixtures)


def _paragraph_docs(real_docs: list[str], n: int) -> list[str]:
    paras = [p for t in real_docs for p in t.split("\n\n") if p.strip()]
    docs, i, k = [], 0, 0
    while i < len(paras) and len(docs) < n:
        m = 1 + (k * 5) % 4
        docs.append("\n\n".join(paras[i:i + m]))
        i, k = i + m, k + 1
    return docs


@pytest.fixture(scope="session")
def corpus(tmp_path_factory, real_docs) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("dist-corpus")
    docs = _paragraph_docs(real_docs, 650)
    assert len(docs) >= 602
    jsonl_docs = docs[:400]
    rows = []
    for i, d in enumerate(jsonl_docs):
        rows.append({"text": d, "id": i})
        if i % 37 == 5:
            rows.append({"text": None, "id": -1})
        if i % 53 == 9:
            rows.append({"text": "  \n ", "id": -2})
    lines = [json.dumps(r) for r in rows]
    lines.insert(100, "")  # a blank line is no record
    (root / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    pq_docs: list[str | None] = list(docs[400:600])
    pq_docs[17] = None
    pq.write_table(pa.table({"text": pq_docs, "n": list(range(len(pq_docs)))}), root / "b.parquet", row_group_size=9)
    txt = [docs[600], "   \n", docs[601] + "\r\nlast line"]
    for name, body in zip(("c1.txt", "c2.txt", "c3.txt"), txt, strict=True):
        (root / name).write_bytes(body.encode("utf-8"))
    paths = [root / "a.jsonl", root / "b.parquet", root / "c1.txt", root / "c2.txt", root / "c3.txt"]
    # The documents a one-process build reads, decoded without niels_gpt.builders.
    expected: list[str] = []
    for line in (root / "a.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            text = json.loads(line)["text"]
            expected.append(Skipped("null_text") if text is None else text)
    n_jsonl = len(expected)
    expected += [Skipped("null_text") if t is None else t for t in pq.read_table(root / "b.parquet").column("text").to_pylist()]
    expected += [t.replace("\r\n", "\n") for t in txt]
    return {"root": root, "paths": paths, "docs": expected, "per_path": [n_jsonl, len(pq_docs), 1, 1, 1]}


@pytest.fixture(scope="session")
def build_reference(tokenizer):
    def build(docs, out: Path, *, source: dict, streaming: bool = False, plan=None, max_tokens, val_tokens, name,
              **settings) -> Path:
        # `build`'s settings (BuildSpec names) as build_pretrain_cache takes them; as `build` records it: where the tokenizer is found again (not in a tokenizer/ directory above);
        # `plan`: the documents are that plan's stream, and carry its origins (builders/origins.py)
        build_pretrain_cache(iter(docs) if plan is None else _Planned(docs, plan), str(out), tokenizer=tokenizer, shuffle_buffer=settings.pop("shuffle_buffer", None),
                             source=source, streaming=streaming, tokenizer_path=recorded_path(tokenizer, out),
                             max_train_tokens=max_tokens, max_val_tokens=val_tokens, dataset_name=name, **settings)
        return out
    return build


class _Planned:
    """`docs`, checked item by item against the plan's stream, with that stream's origins."""

    def __init__(self, docs, plan):
        from niels_gpt.builders.run import _Reader
        self.docs, self.reader = docs, _Reader(plan)

    def __iter__(self):
        return iter(self.docs)

    def with_origins(self):
        for doc, (item, origin) in zip(self.docs, self.reader.with_origins(), strict=True):
            real = isinstance(doc, str) and doc.strip()  # an empty one may be a Skipped in the plan's stream
            assert doc == item if real else not (isinstance(item, str) and item.strip()), (doc, item)
            yield doc, origin

    def origin_table(self):
        return self.reader.origin_table()


def _tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
def tree():
    return _tree


def _kill_when_started(build, started: Path, timeout: float = 120.0,
                       writing: str | None = None) -> tuple[int, list[BaseException]]:
    """Run `build()` on a thread; SIGKILL the process named in `started` as soon as that file appears (and,
    with `writing`, a file matching that glob beside it: the task's half-written part).

    Returns (the killed pid, what build() raised). The task behind `started` must run for a second or
    more, so the kill lands while it works.
    """
    import json
    import os
    import signal
    import threading
    import time

    failure: list[BaseException] = []

    def run():
        try:
            build()
        except BaseException as e:  # noqa: BLE001 (handed to the test thread)
            failure.append(e)

    runner = threading.Thread(target=run)
    runner.start()
    deadline = time.monotonic() + timeout
    while not started.exists() or (writing and not any(started.parent.glob(writing))):
        assert time.monotonic() < deadline and runner.is_alive(), f"{started.name} ({writing}) never appeared"
        time.sleep(0.005)
    pid = json.loads(started.read_text())["pid"]
    os.kill(pid, signal.SIGKILL)  # a worker process of the build this test started
    runner.join(timeout)
    return pid, failure


@pytest.fixture(scope="session")
def kill_when_started():
    return _kill_when_started
