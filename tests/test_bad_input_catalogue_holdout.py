"""Bad-input catalogue, holdout data: the refusals and flags added for data no earlier test had seen (oasst
exports with lone surrogates, no usable conversation or mixed shapes; .bos.idx sidecars that disagree with
their shard; prepare-data's --tokenizer)."""

from __future__ import annotations

import json

import pytest

from .test_bad_input_catalogue import Case, _jsonl, _oasst_trees, check_case, world  # noqa: F401  (world: fixture)


def _oasst_files(w, tmp, *files):
    return ["build-all", "--cache-dir", str(tmp / "out"), "--tokenizer", str(w.tokenizer), "--only", "oasst1",
            "--oasst-data-files", *map(str, files), "--no-progress"]


def _tree(mid: str, answer: str | None) -> dict:
    replies = [] if answer is None else [{"message_id": f"{mid}-a", "role": "assistant", "text": answer, "replies": []}]
    return {"message_id": mid, "role": "prompter", "text": f"question {mid}?", "replies": replies}


def oasst_lone_surrogate(w, tmp):
    return _oasst_trees(w, tmp, _jsonl(tmp / "in" / "s.jsonl", [json.dumps(_tree("r", "fine")),
                                                                 json.dumps(_tree("q", "half \ud800 a pair"))]))


def oasst_no_assistant_reply(w, tmp):
    return _oasst_trees(w, tmp, _jsonl(tmp / "in" / "u.jsonl", [json.dumps(_tree("r", None))]))


def oasst_mixed_data_files(w, tmp):
    nested = _jsonl(tmp / "in" / "trees.jsonl", [json.dumps(_tree("r", "fine"))])
    flat = _jsonl(tmp / "in" / "rows.jsonl", [json.dumps({"message_id": "m", "parent_id": None, "message_tree_id": "m",
                                                         "role": "prompter", "text": "q"})])
    return _oasst_files(w, tmp, nested, flat)


def gutenberg_start_inside_a_book(w, tmp):
    books = tmp / "books"
    books.mkdir()
    (books / "x.txt").write_text("*** START OF BOOK A ***\nbody a\n*** START OF BOOK B ***\nbody b\n"
                                 "*** END OF BOOK B ***\n")
    return ["build-all", "--cache-dir", str(tmp / "out"), "--tokenizer", str(w.tokenizer), "--only", "gutenberg",
            "--gutenberg-dir", str(books), "--gutenberg-val-frac", "0", "--no-progress"]


CASES = [
    Case("oasst lone surrogate in a reply", oasst_lone_surrogate, ("s.jsonl", "line 2", "q-a", "surrogate"),
         out="out/sft"),
    Case("oasst tree without an assistant reply", oasst_no_assistant_reply,
         ("u.jsonl", "no usable conversation", "no_assistant_turn", "nobody answered"), out="out/sft"),
    Case("gutenberg: a second START before the first END", gutenberg_start_inside_a_book,
         ("x.txt", "line 3", "second '*** START OF'"), out="out/pretrain"),
    Case("oasst nested and flat files mixed", oasst_mixed_data_files,
         ("trees.jsonl", "rows.jsonl", "--oasst-trees-jsonl"), out="out/sft"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_gets_one_clear_line_and_no_complete_looking_output(case, world, tmp_path, capsys):  # noqa: F811
    check_case(case, world, tmp_path, capsys)
