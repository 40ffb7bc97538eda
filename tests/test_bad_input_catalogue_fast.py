"""The bad-input catalogue of tokenizer training's sampling and file flags (--max-chars, --doc-chars, --read-as,
--model-type) and of a bad record met while the trainer reads the text.

Each case is held to the catalogue's promises (tests/test_bad_input_catalogue.py: one `error:` line naming the
file, flag or record, no complete-looking output, every input unchanged).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .test_bad_input_catalogue import Case, check_case, world  # noqa: F401  (the shared fixture)


def _data(tmp: Path, n: int = 12, suffix: str = ".jsonl") -> Path:
    from .conftest import sample_texts

    d = tmp / "data"
    d.mkdir(parents=True, exist_ok=True)
    rows = [json.dumps({"text": t}) for t in sample_texts()[:n] if t.strip()]
    (d / f"part{suffix}").write_text("\n".join(rows) + "\n")
    return d


def _train(tmp: Path, *extra, src: Path | None = None) -> list[str]:
    return ["train-tokenizer", str(src or _data(tmp)), "--out", str(tmp / "out"), "--vocab-size", "300",
            "--no-progress", *extra]


def max_chars_zero(w, tmp):
    return _train(tmp, "--max-chars", "0")


def doc_chars_zero(w, tmp):
    return _train(tmp, "--max-chars", "100000", "--doc-chars", "0")


def max_chars_not_a_number(w, tmp):
    return _train(tmp, "--max-chars", "lots")


def read_as_an_unknown_kind(w, tmp):
    return _train(tmp, "--read-as", ".dict=words")


def read_as_without_sources(w, tmp):
    return ["train-tokenizer", "--cache-dir", str(tmp / "out"), "--sample", "--read-as", ".dict=text", "--no-progress"]


def model_type_unknown(w, tmp):
    return _train(tmp, "--model-type", "wordpiece")


def a_bad_line_in_the_training_text(w, tmp):
    d = _data(tmp)
    with open(d / "part.jsonl", "a") as f:
        f.write('{"text": "cut short\n')
    return _train(tmp, src=d)


CASES = [
    Case("train-tokenizer: --max-chars 0", max_chars_zero, ("--max-chars 0", ">= 1"), out="out"),
    Case("train-tokenizer: --doc-chars 0", doc_chars_zero, ("--doc-chars 0", ">= 1"), out="out"),
    Case("train-tokenizer: --max-chars not a number", max_chars_not_a_number, ("--max-chars", "lots"), status=2,
         out="out"),
    Case("train-tokenizer: --read-as an unknown kind", read_as_an_unknown_kind, ("--read-as .dict=words", "text"),
         out="out"),
    Case("train-tokenizer: --read-as without SRC", read_as_without_sources, ("--read-as", "SRC"), out="out"),
    Case("train-tokenizer: --model-type of no sentencepiece kind", model_type_unknown, ("--model-type", "wordpiece"),
         status=2, out="out"),
    Case("train-tokenizer: a line of the training text that is not JSON", a_bad_line_in_the_training_text,
         ("part.jsonl, line", "not valid json", "--on-bad-record skip"), out="out"),
]


@pytest.fixture
def back_home():
    here = os.getcwd()
    yield
    os.chdir(here)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_tokenizer_training_input_gets_one_clear_line_and_nothing_lost(case, world, tmp_path, capsys,  # noqa: F811
                                                                           back_home):
    check_case(case, world, tmp_path, capsys)
