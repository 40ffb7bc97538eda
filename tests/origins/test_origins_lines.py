"""JSON Lines records are stored as lines, with a sparse line -> byte index in origins.json that finds any line
without reading the file from its start."""

from __future__ import annotations

import json

import numpy as np

from niels_gpt.sources.origins import BYTE_OFFSET, LINE, LINE_INDEX_RECORDS, as_lines, line_start


def test_offsets_become_lines_and_the_index_finds_every_line_again(tmp_path):
    path = tmp_path / "a.jsonl"
    lines = [json.dumps({"text": "x" * (k % 7)}) if k % 5 else "" for k in range(700)]  # blank lines between
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    starts = np.cumsum([0] + [len(x) + 1 for x in lines[:-1]])
    used = [k for k in range(700) if lines[k]]
    rows = np.array([[0, int(starts[k]), 0, 1] for k in reversed(used)], dtype=np.int64)  # any order
    [entry] = as_lines(rows, [{"path": str(path), "kind": ".jsonl", "record": BYTE_OFFSET}])
    assert entry["record"] == LINE and rows[:, 1].tolist() == [k + 1 for k in reversed(used)]
    assert len(entry["lines"]) == -(-len(used) // LINE_INDEX_RECORDS) and entry["lines"][0] == [2, int(starts[1])]
    for k in range(700):
        assert line_start(entry, k + 1) == starts[k]
    assert line_start(entry, 702) is None  # past the end


def test_an_input_not_at_hand_keeps_byte_offsets(tmp_path):
    rows = np.array([[0, 40, 0, 1]], dtype=np.int64)
    entry = {"path": "https://example.org/a.jsonl", "kind": ".jsonl", "record": BYTE_OFFSET}
    assert as_lines(rows, [entry]) == [entry] and rows[0, 1] == 40
    assert line_start(entry, 40) == 40
