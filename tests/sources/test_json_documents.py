"""A `.json` file holding one JSON document (an export's pretty-printed array, or an object holding one array of
records) is read as those records, exactly as the same records written one per line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta
from niels_gpt.errors import SourceError
from niels_gpt.sources.records import pieces, records

from ..conftest import sample_texts

ROWS = [{"text": t, "id": i} for i, t in enumerate(t for t in sample_texts()[:8] if t.strip())]


def _shards(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "train").glob("shard_*"))}


def _build(src: Path, out: Path, tokenizer, *extra) -> dict:
    assert main(["build", str(src), "--out", str(out), "--tokenizer", tokenizer.model_path, "--no-progress",
                 *extra]) == 0
    return read_meta(str(out))


@pytest.mark.parametrize("layout", ["array", "object holding an array", "gzip array"])
def test_a_pretty_printed_json_export_builds_the_cache_its_records_as_lines_build(tokenizer, tmp_path, layout):
    (tmp_path / "lines.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    doc = ROWS if layout != "object holding an array" else {"version": 2, "rows": ROWS}
    text = json.dumps(doc, indent=2)
    name = "export.json.gz" if layout == "gzip array" else "export.json"
    (tmp_path / name).write_bytes(gzip.compress(text.encode()) if layout == "gzip array" else text.encode())
    want = _build(tmp_path / "lines.jsonl", tmp_path / "a", tokenizer)
    # task bytes far below the file's size: a document is never cut into line ranges
    got = _build(tmp_path / name, tmp_path / "b", tokenizer, "--task-bytes", "64", "--executor", "inline")
    assert got["totals"] == want["totals"] and got["totals"]["train_documents"] == len(ROWS)
    assert _shards(tmp_path / "b") == _shards(tmp_path / "a")


def test_a_document_is_one_piece_and_its_records_are_named_by_position(tmp_path):
    path = tmp_path / "export.json"
    path.write_text(json.dumps([ROWS[0], "stray", ROWS[1]], indent=1))
    (one,) = pieces(path, task_bytes=16)
    got = list(records(one))
    assert [w for w, _ in got] == [f"{path}, record {i}" for i in (1, 2, 3)]
    assert got[0][1] == ROWS[0] and got[2][1] == ROWS[1]
    assert got[1][1].reason == "not_an_object" and "record 2" in str(got[1][1])


def test_json_lines_in_a_json_file_still_cut_into_line_ranges(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert len(pieces(path, task_bytes=64)) > 1


def test_a_pretty_printed_single_record_is_one_record(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}, indent=2))
    (one,) = pieces(path, task_bytes=16)
    assert [r for _, r in records(one)] == [{"messages": [{"role": "user", "content": "hi"}]}]


def test_a_broken_document_is_one_error_naming_the_file(tmp_path):
    path = tmp_path / "export.json"
    path.write_text(json.dumps(ROWS, indent=2)[:-40])
    (one,) = pieces(path, task_bytes=1 << 20)
    with pytest.raises(SourceError, match=r"export.json: opens a JSON document .* not valid JSON"):
        list(records(one))


def test_a_document_is_planned_as_one_task_of_the_files_size(tmp_path):
    from niels_gpt.builders.plan import make_plan

    path = tmp_path / "export.json"
    path.write_text(json.dumps(ROWS, indent=2))
    plan = make_plan([path], tokenizer=None, task_bytes=64)
    assert [t.bytes for t in plan.tasks] == [path.stat().st_size]


@pytest.mark.parametrize("opening", ['{"rows": [', '{"version": 2,', '{"meta": {"v": 2},', '{"rows":'])
@pytest.mark.parametrize("name", ["export.json", "export.json.gz"])
def test_an_object_opening_its_array_on_its_first_line_is_read_as_its_records(tmp_path, opening, name):
    # `{"rows": [` then one record a line: a JSON document however its first line is wrapped, not lines
    from niels_gpt.sources.corpus import corpus

    head = {'{"rows": [': '{"rows": [\n', '{"version": 2,': '{"version": 2,\n"rows": [\n',
            '{"meta": {"v": 2},': '{"meta": {"v": 2},\n"rows": [\n', '{"rows":': '{"rows":\n[\n'}[opening]
    text = head + ",\n".join(json.dumps(r) for r in ROWS) + "\n]}\n"
    json.loads(text)
    (tmp_path / name).write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    assert list(corpus([tmp_path / name]).iter_texts()) == [r["text"] for r in ROWS]
