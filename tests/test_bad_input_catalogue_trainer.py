"""The bad-input catalogue of `train-tokenizer --trainer rustbpe`: a vocabulary smaller than the 256 single bytes,
a model type or setting of sentencepiece's, the flag without SRC, text no UTF-8 can hold, and rustbpe not installed.

Each case is held to the catalogue's promises (tests/test_bad_input_catalogue.py: one `error:` line naming the
file, flag or record, no complete-looking output, every input unchanged).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from .test_bad_input_catalogue import Case, check_case, world  # noqa: F401  (the shared fixture)


def _data(tmp: Path, extra: list[str] = ()) -> Path:
    from .conftest import sample_texts

    d = tmp / "data"
    d.mkdir(parents=True, exist_ok=True)
    rows = [json.dumps({"text": t}) for t in [*sample_texts()[:12], *extra] if t.strip()]
    (d / "part.jsonl").write_text("\n".join(rows) + "\n")
    return d


def _train(tmp: Path, *extra, vocab: str = "300", src: Path | None = None) -> list[str]:
    return ["train-tokenizer", str(src or _data(tmp)), "--out", str(tmp / "out"), "--vocab-size", vocab,
            "--trainer", "rustbpe", "--no-progress", *extra]


def vocab_below_the_bytes(w, tmp):
    return _train(tmp, vocab="200")


def unigram_with_rustbpe(w, tmp):
    return _train(tmp, "--model-type", "unigram")


def a_sentencepiece_setting(w, tmp):
    return _train(tmp, "--character-coverage", "0.99")


def trainer_without_sources(w, tmp):
    return ["train-tokenizer", "--cache-dir", str(tmp / "out"), "--sample", "--trainer", "rustbpe", "--no-progress"]


def trainer_unknown(w, tmp):
    return _train(tmp)[:-3] + ["--trainer", "wordpiece"]


def a_lone_surrogate(w, tmp):
    return _train(tmp, src=_data(tmp, ["text with a lone \ud800 surrogate"]))


def only_whitespace(w, tmp):
    d = tmp / "blank"
    d.mkdir(parents=True)
    (d / "part.jsonl").write_text(json.dumps({"text": "   \n\t "}) + "\n")
    return _train(tmp, src=d)


def rustbpe_missing(w, tmp):
    sys.modules["rustbpe"] = None  # what an environment without the package imports (restored by the fixture)
    return _train(tmp)


CASES = [
    Case("train-tokenizer --trainer rustbpe: --vocab-size below the 256 bytes", vocab_below_the_bytes,
         ("--vocab-size 200", "256", "at least"), out="out"),
    Case("train-tokenizer --trainer rustbpe: --model-type unigram", unigram_with_rustbpe,
         ("--model-type unigram", "--trainer rustbpe", "bpe"), out="out"),
    Case("train-tokenizer --trainer rustbpe: a sentencepiece setting", a_sentencepiece_setting,
         ("--character-coverage", "sentencepiece", "--trainer rustbpe"), out="out"),
    Case("train-tokenizer --trainer rustbpe without SRC", trainer_without_sources, ("--trainer rustbpe", "SRC"),
         out="out"),
    Case("train-tokenizer: --trainer of no known kind", trainer_unknown, ("--trainer", "wordpiece"), status=2,
         out="out"),
    Case("train-tokenizer --trainer rustbpe: a lone surrogate in the text", a_lone_surrogate,
         ("lone surrogate", "utf-8"), out="out"),
    Case("train-tokenizer --trainer rustbpe: only whitespace", only_whitespace, ("part.jsonl", "whitespace"),
         out="out"),
    Case("train-tokenizer --trainer rustbpe: rustbpe not installed", rustbpe_missing,
         ("--trainer rustbpe", "pip install"), out="out"),
]


@pytest.fixture
def back_home():
    here = os.getcwd()
    had = sys.modules.get("rustbpe")
    yield
    os.chdir(here)
    if "rustbpe" in sys.modules and sys.modules["rustbpe"] is None:  # the case that hid it
        if had is None:
            del sys.modules["rustbpe"]
        else:
            sys.modules["rustbpe"] = had


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_rustbpe_training_input_gets_one_clear_line_and_nothing_lost(case, world, tmp_path, capsys,  # noqa: F811
                                                                         back_home):
    check_case(case, world, tmp_path, capsys)
