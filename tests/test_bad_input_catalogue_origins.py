"""Bad-input catalogue: origins (a document named by INPUT:RECORD that names no input, no line, a record that
made no document, a cache without origins; an origins file changed after the build).

Each case goes through check_case: exit status 1, one `error: ...` line with the case's key phrases, and the
inputs it read unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from niels_gpt.cache.cli import main
from niels_gpt.train.train import TrainConfig, train

from .test_bad_input_catalogue import Case, check_case, world  # noqa: F401

TINY = dict(depth=1, n_embd=32, n_head=2, sequence_len=16, device_batch_size=2, steps=2, eval_steps=1, log_every=0)


def _run(w, tmp: Path, *, origins: bool = True) -> tuple[Path, Path]:
    """(a 2-step run, the cache it trained on): a cache built from notes.jsonl (line 2 is an empty text)."""
    cache = tmp / "cache"
    if origins:
        src = tmp / "notes.jsonl"
        lines = [json.dumps({"text": f"note {i}: " + "some words of text " * (3 + i % 5)}) for i in range(80)]
        lines[1] = json.dumps({"text": ""})
        src.write_text("\n".join(lines) + "\n", encoding="utf-8")
        assert main(["build", str(src), "--out", str(cache), "--tokenizer", str(w.tokenizer), "--val-tokens", "200",
                     "--no-progress"]) == 0
    else:
        cache = w.pretrain
    run = tmp / "run"
    train(TrainConfig(data=str(cache), out_dir=str(run), **TINY), log=lambda *a: None)
    return run, cache


def no_such_input(w, tmp):
    return ["trace", str(_run(w, tmp)[0]), "--document", "other.jsonl:3"]


def no_such_line(w, tmp):
    return ["trace", str(_run(w, tmp)[0]), "--document", "notes.jsonl:999"]


def record_made_no_document(w, tmp):
    return ["trace", str(_run(w, tmp)[0]), "--document", "notes.jsonl:2"]


def cache_without_origins(w, tmp):
    return ["trace", str(_run(w, tmp, origins=False)[0]), "--document", "notes.jsonl:3"]


def origins_changed_after_the_build(w, tmp):
    run, cache = _run(w, tmp)
    path = cache / "origins.npy"
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01
    path.write_bytes(bytes(data))
    return ["trace", str(run), "--step", "1"]


CASES = [
    Case("origins: --document names an input the cache was not built from", no_such_input,
         ("other.jsonl:3", "no input", "named 'other.jsonl'", "notes.jsonl")),
    Case("origins: --document names a line the input does not have", no_such_line,
         ("notes.jsonl:999", "has no line 999")),
    Case("origins: --document names a record that made no document", record_made_no_document,
         ("notes.jsonl:2", "no document", "came from that record", "skipped")),
    Case("origins: --document INPUT:RECORD on a cache built before origins", cache_without_origins,
         ("notes.jsonl:3", "records no origins", "split:index")),
    Case("origins: an origins file changed after the build", origins_changed_after_the_build,
         ("origins.npy", "sha256 differs from meta.json", "rebuild the cache")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_origins_bad_input_gets_one_line(case, world, tmp_path, capsys):  # noqa: F811
    check_case(case, world, tmp_path, capsys)
