"""The bad-input catalogue of build-all's named sources (sources/named.py): each named source's flags refused
before any work, in one line naming the flag and what to give instead.

Each case is held to the catalogue's promises (tests/test_bad_input_catalogue.py: one `error:` line naming the
file, flag or record, no complete-looking output, every input unchanged).
"""

from __future__ import annotations

import gzip
import json

import pytest

from .test_bad_input_catalogue import Case, check_case, world  # noqa: F401  (the shared fixture)


def _build_all(w, tmp, *extra) -> list[str]:
    return ["build-all", "--cache-dir", str(tmp / "out"), "--tokenizer", str(w.tokenizer), "--no-progress", *extra]


def wikitext_val_file_without_train_file(w, tmp):
    (tmp / "wiki.valid.raw").write_text(" = A =\n text\n")
    return _build_all(w, tmp, "--only", "wikitext", "--wikitext-val-file", str(tmp / "wiki.valid.raw"))


def fineweb_buffer_size_zero(w, tmp):
    return _build_all(w, tmp, "--sample", "--only", "fineweb_edu", "--fineweb-buffer-size", "0")


def roam_val_frac_one(w, tmp):
    (tmp / "notes").mkdir()
    (tmp / "notes" / "a.md").write_text("- a note\n")
    return _build_all(w, tmp, "--only", "roam", "--roam-dir", str(tmp / "notes"), "--roam-val-frac", "1")


def oasst_files_of_both_kinds(w, tmp):
    (tmp / "rows.jsonl").write_text('{"message_id": "m", "parent_id": null, "message_tree_id": "m", "role": '
                                    '"prompter", "text": "q"}\n')
    return _build_all(w, tmp, "--only", "oasst1", "--oasst-data-files", str(tmp / "rows.jsonl"),
                      "--oasst-trees-jsonl", str(tmp / "rows.jsonl"))


def oasst_compressed_trees_among_flat_rows(w, tmp):
    tree = {"message_id": "t", "role": "prompter", "text": "q", "replies": [
        {"message_id": "a", "role": "assistant", "text": "an answer", "replies": []}]}
    (tmp / "trees.jsonl.gz").write_bytes(gzip.compress((json.dumps(tree) + "\n").encode()))
    (tmp / "rows.jsonl").write_text('{"message_id": "m", "parent_id": null, "message_tree_id": "m", "role": '
                                    '"prompter", "text": "q"}\n')
    return _build_all(w, tmp, "--only", "oasst1", "--oasst-data-files", str(tmp / "trees.jsonl.gz"),
                      str(tmp / "rows.jsonl"))


CASES = [
    Case("build-all: --wikitext-val-file without --wikitext-train-file", wikitext_val_file_without_train_file,
         ("--wikitext-val-file", "--wikitext-train-file"), out="out/pretrain"),
    Case("build-all: --fineweb-buffer-size 0", fineweb_buffer_size_zero, ("--fineweb-buffer-size 0", ">= 1"),
         out="out/pretrain"),
    Case("build-all: --roam-val-frac 1", roam_val_frac_one, ("--roam-val-frac 1", "[0, 1)"), out="out/pretrain"),
    Case("build-all: oasst1 flat rows and nested trees at once", oasst_files_of_both_kinds,
         ("--oasst-data-files", "--oasst-trees-jsonl", "not both"), out="out/sft"),
    Case("build-all: oasst1 data files mixing a compressed nested export and flat rows",
         oasst_compressed_trees_among_flat_rows, ("trees.jsonl.gz", "rows.jsonl", "mix nested trees",
                                                  "--oasst-trees-jsonl"), out="out/sft"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_named_source_flags_get_one_clear_line(case, world, tmp_path, capsys):  # noqa: F811
    check_case(case, world, tmp_path, capsys)
