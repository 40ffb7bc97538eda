"""Bad-input catalogue: the named layouts refuse records that are not theirs in one line naming the file, the line
and what was found: `--format oasst` over records of another shape, `--format gutenberg` over a text file
without its licence markers, `--format dolly` over rows without a response, a chat layout over a text file."""

from __future__ import annotations

import json

import pytest

from .test_bad_input_catalogue import Case, check_case, world  # noqa: F401  (world: a fixture)


def _build(w, tmp, data, *flags):
    return ["build", str(data), "--out", str(tmp / "out" / "c"), "--tokenizer", str(w.tokenizer), "--executor",
            "inline", "--no-progress", *flags]


def oasst_over_other_records(w, tmp):
    f = tmp / "chats.jsonl"
    f.write_text(json.dumps({"conversation": [], "id": 3}) + "\n")
    return _build(w, tmp, f, "--chat", "--format", "oasst")


def gutenberg_without_markers(w, tmp):
    f = tmp / "book.txt"
    f.write_text("A story with no licence header.\n")
    return _build(w, tmp, f, "--format", "gutenberg")


def dolly_without_response(w, tmp):
    f = tmp / "dolly.jsonl"
    f.write_text(json.dumps({"instruction": "q", "context": "", "answer": "x"}) + "\n")
    return _build(w, tmp, f, "--chat", "--format", "dolly")


def alpaca_over_a_text_file(w, tmp):
    f = tmp / "notes.txt"
    f.write_text("Some prose, not instruction records.\n")
    return _build(w, tmp, f, "--chat", "--format", "alpaca")


CASES = [
    Case("build --format oasst: a record that is no oasst tree", oasst_over_other_records,
         ("chats.jsonl, line 1", "not an oasst1 tree", "'conversation', 'id'"), out="out"),
    Case("build --format gutenberg: no START line", gutenberg_without_markers,
         ("book.txt", "no '*** start of", "licence header"), out="out"),
    Case("build --format dolly: no response field", dolly_without_response,
         ("dolly.jsonl, line 1", "'response' is missing"), out="out"),
    Case("build --chat --format alpaca: a text file", alpaca_over_a_text_file,
         ("notes.txt", "a text file is one document, not a conversation"), out="out"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_record_not_of_the_named_layout_gets_one_clear_line(case, world, tmp_path, capsys):  # noqa: F811
    check_case(case, world, tmp_path, capsys)
