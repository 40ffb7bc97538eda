"""roam and gutenberg through the input layer: one document per file (a book per book), the files split by a
seeded permutation of the sorted names (build-all's table, sources/named.py)."""

from __future__ import annotations

import os

import pytest

from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources.corpus import corpus
from niels_gpt.sources.layouts import gutenberg_books
from niels_gpt.sources.named import inputs

NOTES = {
    "Alpha.md": "- alpha block\n    - nested\n",
    "Beta.md": "\ufeff- beta\r\n- second\r\n",
    "Charlie.md": "- [[Alpha]] links here\n",
    "Delta.md": " \n\n",
    "sub/Echo.md": "- echo #tag\n",
}


def make_notes(root):
    for name, text in NOTES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(text.encode("utf-8"))
    return root


class Split:
    """A directory source as build-all reads it: its split by file, each split read lazily by the layer."""

    def __init__(self, name, directory, *, val_frac=0.1, seed=42):
        self.directory = directory
        self.spec = inputs(name, {f"{name}_dir": str(directory), f"{name}_val_frac": val_frac}, seed=seed)
        self.layout = self.spec["layout"]
        self.skipped = {}

    def split_files(self, split):
        return [os.path.relpath(p, self.directory) for p in self.spec["sources" if split == "train" else "val_sources"]]

    def files(self):
        return sorted(self.split_files("train") + self.split_files("val"))

    def iter_texts(self, split=None):
        for s in ["train", "val"] if split is None else [split]:
            paths = self.spec["sources" if s == "train" else "val_sources"]
            if paths:
                src = corpus(paths, layout=self.layout)
                yield from src.iter_texts()
                for k, n in src.skipped.items():
                    self.skipped[k] = self.skipped.get(k, 0) + n


def roam(directory, **kw):
    return Split("roam", directory, **kw)


def gutenberg(directory, **kw):
    return Split("gutenberg", directory, **kw)


def book(title: str, body: str, *, start="*** START OF THIS PROJECT GUTENBERG EBOOK {t} ***",
         end="*** END OF THIS PROJECT GUTENBERG EBOOK {t} ***") -> bytes:
    text = (f"\ufeffThe Project Gutenberg EBook of {title}\n\nLicence words.\n\n{start.format(t=title)}\n\n\n"
            f"{body}\n\n\n\nEnd of the Project Gutenberg EBook of {title}, by\nSomeone\n\n"
            f"{end.format(t=title)}\n\nMore licence words.\n")
    return text.replace("\n", "\r\n").encode("utf-8")


def test_roam_one_document_per_note_split_by_seeded_file_list(tmp_path):
    src = roam(make_notes(tmp_path))
    assert src.files() == ["Alpha.md", "Beta.md", "Charlie.md", "Delta.md", "sub/Echo.md"]
    # torch.randperm(5, generator=manual_seed(42)) starts with 2: one val note (round-half-up of 0.5)
    assert src.split_files("val") == ["Charlie.md"]
    assert src.split_files("train") == ["Alpha.md", "Beta.md", "Delta.md", "sub/Echo.md"]
    assert list(src.iter_texts("train")) == ["- alpha block\n    - nested\n", "- beta\n- second\n",
                                             "- echo #tag\n"]
    assert src.skipped == {"empty_document": 1}
    assert list(src.iter_texts("val")) == ["- [[Alpha]] links here\n"]
    assert src.spec["extra"]["skipped_inputs"] == []


def test_roam_split_is_deterministic_and_seed_dependent(tmp_path):
    make_notes(tmp_path)
    for i in range(20):
        (tmp_path / f"n{i:02d}.md").write_text(f"- note {i}\n")
    a, b, c = roam(tmp_path, seed=42), roam(tmp_path, seed=42), roam(tmp_path, seed=3)
    assert a.split_files("val") == b.split_files("val") and len(a.split_files("val")) == 3
    assert c.split_files("val") != a.split_files("val")
    assert list(a.iter_texts()) == list(b.iter_texts())
    assert sorted(a.split_files("train") + a.split_files("val")) == a.files()
    assert roam(tmp_path, val_frac=0.0).split_files("val") == []


def test_roam_rejections(tmp_path):
    with pytest.raises(SourceError, match=r"export: no such directory \(roam\)"):
        roam(tmp_path / "export")
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(SourceError, match=r"no \.md files in this directory \(roam\)"):
        roam(tmp_path)
    with pytest.raises(ConfigError, match=r"--roam-val-frac 1.5: must be in \[0, 1\)"):
        roam(make_notes(tmp_path), val_frac=1.5)


def test_roam_invalid_utf8_names_file_and_byte(tmp_path):
    (tmp_path / "ok.md").write_text("- fine\n")
    (tmp_path / "bad.md").write_bytes(b"- one\n- caf\xe9\n")
    with pytest.raises(SourceError, match=r"bad.md: invalid UTF-8 at byte 11, line 2: invalid continuation"):
        list(roam(tmp_path, val_frac=0).iter_texts())


def test_roam_unreadable_file_is_named(tmp_path):
    (tmp_path / "ok.md").write_text("- fine\n")
    os.symlink(tmp_path / "target-gone", tmp_path / "gone.md")  # listed, but cannot be opened
    with pytest.raises(SourceError, match=r"gone.md: a symlink to nothing \(its target .*target-gone is missing\)"):
        list(roam(tmp_path, val_frac=0).iter_texts())


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_roam_permission_denied_is_named(tmp_path):
    p = tmp_path / "secret.md"
    p.write_text("- x\n")
    p.chmod(0)
    with pytest.raises(SourceError, match=r"secret.md: cannot read this file \(Permission denied\)"):
        list(roam(tmp_path, val_frac=0).iter_texts())


def test_gutenberg_strips_licence_bom_and_crlf(tmp_path):
    (tmp_path / "b_2.txt").write_bytes(book("B", "CHAPTER I\n\nIt was dark."))
    (tmp_path / "a_1.txt").write_bytes(book("A", "Title A\n\nOnce upon a time."))
    (tmp_path / "c_3.txt").write_bytes(book("C", "The end.", start="***START OF THE PROJECT GUTENBERG EBOOK {t}***"))
    src = gutenberg(tmp_path)
    assert src.files() == ["a_1.txt", "b_2.txt", "c_3.txt"]
    assert src.split_files("val") == ["a_1.txt"]  # torch.randperm(3, manual_seed(42))[0] == 0
    assert list(src.iter_texts("train")) == ["CHAPTER I\n\nIt was dark.", "The end."]
    assert list(src.iter_texts("val")) == ["Title A\n\nOnce upon a time."]
    assert gutenberg(tmp_path, seed=1).split_files("val") == ["b_2.txt"]


def test_gutenberg_rejects_files_without_markers(tmp_path):
    with pytest.raises(SourceError, match=r"book.txt: no '\*\*\* START OF \.\.\.' line"):
        gutenberg_books("Just a text.\n", "book.txt")
    with pytest.raises(SourceError, match=r"book.txt: a '\*\*\* START OF' line but no '\*\*\* END OF"):
        gutenberg_books("*** START OF X ***\nbody\n", "book.txt")
    (tmp_path / "plain.txt").write_text("no markers here")
    with pytest.raises(SourceError, match=r"plain.txt: no '\*\*\* START OF"):
        list(gutenberg(tmp_path).iter_texts())
    with pytest.raises(SourceError, match=r"no such directory \(gutenberg\)"):
        gutenberg(tmp_path / "books")


def test_gutenberg_empty_book_is_skipped_and_counted(tmp_path):
    (tmp_path / "a.txt").write_bytes(book("A", "Some text."))
    (tmp_path / "e.txt").write_bytes(book("E", "   "))
    src = gutenberg(tmp_path, val_frac=0)
    assert list(src.iter_texts()) == ["Some text."]
    assert src.skipped == {"empty_document": 1}


def test_a_file_of_two_books_gives_two_documents(tmp_path):
    two = book("A", "First book's text.") + book("B", "CHAPTER I\n\nSecond book's text.")
    (tmp_path / "two.txt").write_bytes(two)
    (tmp_path / "one.txt").write_bytes(book("C", "Third."))
    src = gutenberg(tmp_path, val_frac=0)
    assert list(src.iter_texts()) == ["Third.", "First book's text.", "CHAPTER I\n\nSecond book's text."]
    assert len(gutenberg_books(two.decode("utf-8"), "two.txt")) == 2


def test_a_second_start_before_the_first_end_is_refused_naming_the_lines(tmp_path):
    text = "*** START OF BOOK A ***\nbody a\n*** START OF BOOK B ***\nbody b\n*** END OF BOOK B ***\n"
    (tmp_path / "x.txt").write_text(text)
    with pytest.raises(SourceError, match=r"x.txt: a second '\*\*\* START OF' line \(line 3\) before the first "
                                          r"book's '\*\*\* END OF' line \(line 5\)"):
        list(gutenberg(tmp_path, val_frac=0).iter_texts())
