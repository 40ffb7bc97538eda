"""The shared pieces: the seeded file split, strict UTF-8 with byte offsets, text normalisation."""

from __future__ import annotations

import pytest

from niels_gpt.errors import SourceError
from niels_gpt.sources.base import split_by_file, val_count
from niels_gpt.sources.text_io import decode_utf8, list_files, normalise_text


def test_val_count_rounds_half_up_keeps_one_val_and_one_train():
    assert [val_count(n, 0.1) for n in (0, 1, 2, 5, 10, 14, 15, 25, 30, 100)] == [0, 0, 1, 1, 1, 1, 2, 3, 3, 10]
    assert val_count(10, 0.0) == 0
    assert val_count(3, 0.9) == 2  # never every file


def test_split_by_file_is_a_seeded_torch_permutation():
    import torch

    names = [f"n{i:02d}" for i in range(20)]
    split = split_by_file(names, 0.1, seed=42)
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(42)).tolist()
    assert split["val"] == sorted(perm[:2])
    assert split["train"] == [i for i in range(20) if i not in perm[:2]]
    assert split == split_by_file(names, 0.1, seed=42)
    assert split_by_file(names, 0.1, seed=43)["val"] != split["val"]


def test_decode_utf8_names_file_byte_offset_and_line(tmp_path):
    p = tmp_path / "f.txt"
    with pytest.raises(SourceError, match=r"f.txt: invalid UTF-8 at byte 8, line 3 \(record 7\)"):
        decode_utf8(b"ab\ncd\nxy\xffz", p, record="record 7")


def test_normalise_text_drops_bom_and_crlf():
    assert normalise_text("\ufeffa\r\nb\rc\n") == "a\nb\nc\n"
    assert normalise_text("mid\ufeff") == "mid\ufeff"


def test_list_files_rejects_missing_and_empty_directories(tmp_path):
    with pytest.raises(SourceError, match=r"nope: no such directory \(roam\)"):
        list_files(tmp_path / "nope", ".md", "roam")
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(SourceError, match=r"no \.md files in this directory \(roam\)"):
        list_files(tmp_path, ".md", "roam")


def test_list_files_sorted_recursive_without_dot_files(tmp_path):
    for name in ("b.md", "a.md", "sub/c.md", ".hidden/d.md", ".e.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    assert [p.relative_to(tmp_path).as_posix() for p in list_files(tmp_path, ".md", "roam")] == [
        "a.md", "b.md", "sub/c.md"]
