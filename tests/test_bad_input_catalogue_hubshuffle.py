"""Bad-input catalogue: `build --shuffle-buffer` over a dataset id (shuffled by `datasets`) and local files (the
builder's torch buffer) at once, refused before any work in one line naming the flag, the two inputs and what
to do instead. The hub is out of reach here: the dataset id is opened as a local JSON Lines file through the
same `datasets` calls (tests/sources/test_hub_shuffle.py)."""

from __future__ import annotations

import pytest

from .test_bad_input_catalogue import Case, check_case, world  # noqa: F401  (world: a fixture)


def _rows(tmp):
    f = tmp / "rows.jsonl"
    f.write_text("".join(f'{{"text": "document {i} of the hub stream"}}\n' for i in range(12)))
    return f


def dataset_id_and_local_file_shuffled(w, tmp):
    return ["build", "someone/web", str(_rows(tmp)), "--out", str(tmp / "out" / "c"), "--tokenizer", str(w.tokenizer),
            "--shuffle-buffer", "8", "--no-progress"]


CASES = [
    Case("build: --shuffle-buffer over a dataset id and local files", dataset_id_and_local_file_shuffled,
         ("--shuffle-buffer 8", "someone/web", "rows.jsonl", "one stream takes one shuffle", "separate caches"),
         out="out"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_shuffle_of_two_kinds_gets_one_clear_line(case, world, tmp_path, capsys, monkeypatch):  # noqa: F811
    import datasets

    from niels_gpt.sources import records

    monkeypatch.setattr(records, "open_stream", lambda item, what, **kw: datasets.load_dataset(
        "json", data_files=str(tmp_path / "rows.jsonl"), split="train", streaming=True))
    check_case(case, world, tmp_path, capsys)
