"""A directory source (roam, gutenberg) names every file it does not read: meta.json's skipped_inputs."""

from __future__ import annotations

from niels_gpt.builders.common import common_meta
from niels_gpt.sources.corpus import corpus
from niels_gpt.sources.named import inputs

BOOK = "*** START OF THE PROJECT GUTENBERG EBOOK X ***\nCall me Ishmael.\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\n"


def test_a_gutenberg_directory_lists_the_files_it_does_not_read(tmp_path):
    (tmp_path / "moby.txt").write_text(BOOK)
    (tmp_path / "gcide.dict").write_text("A word, n.\n")
    (tmp_path / ".DS_Store").write_bytes(b"\0")
    spec = inputs("gutenberg", {"gutenberg_dir": str(tmp_path), "gutenberg_val_frac": 0.0}, seed=42)
    left = {e["path"].rsplit("/", 1)[-1]: e["reason"] for e in spec["extra"]["skipped_inputs"]}
    assert sorted(left) == [".DS_Store", "gcide.dict"]
    assert "only .txt files" in left["gcide.dict"] and "--format text" in left["gcide.dict"]
    assert list(corpus(spec["sources"], layout=spec["layout"]).iter_texts()) == ["Call me Ishmael."]


class _Tok:
    sha256, token_dtype, special_ids = "0" * 64, "<u2", {}

    def describe(self):
        return {}

    def __len__(self):
        return 1


def test_meta_json_holds_skipped_inputs_at_its_top_level_only_when_some_were(tmp_path):
    (tmp_path / "a.md").write_text("note")
    def source() -> dict:  # what build() hands meta.json: the corpus read and the split's facts
        spec = inputs("roam", {"roam_dir": str(tmp_path)}, seed=42)
        return {**corpus(spec["sources"]).describe(), **spec["extra"]}

    assert "skipped_inputs" not in common_meta(_Tok(), __import__("numpy").dtype("<u2"), 0, "n", None, False, source())
    (tmp_path / "b.org").write_text("other note")
    meta = common_meta(_Tok(), __import__("numpy").dtype("<u2"), 0, "n", None, False, source())
    assert [e["path"].rsplit("/", 1)[-1] for e in meta["skipped_inputs"]] == ["b.org"]
    assert "skipped_inputs" not in meta["source"]


def test_build_all_names_the_left_out_files_in_its_summary():
    from niels_gpt.builders.build_all import format_summary

    rows = [{"name": "gutenberg", "kind": "pretrain", "train_tokens": 5, "val_tokens": 0, "files": 1, "seconds": 1.0,
             "skipped_inputs": [{"path": "books/gcide.dict", "reason": "gutenberg reads only .txt files"}]}]
    assert "gutenberg: books/gcide.dict (gutenberg reads only .txt files)" in format_summary(rows)
