"""The output guard (niels_gpt/output_guard.py): what a command may replace, decided in one place."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from niels_gpt.output_guard import OutputRefused, check_output


def _cache(d: Path, kind: str = "pretrain", extra: dict | None = None) -> Path:
    (d / "train").mkdir(parents=True)
    (d / "train" / "shard_00000.bin").write_bytes(b"\x01\x00" * 4)
    files = {"train/shard_00000.bin": {"bytes": 8, "tokens": 4, "sha256": "0" * 64}}
    (d / "meta.json").write_text(json.dumps({"kind": kind, "files": files, **(extra or {})}))
    return d


def test_a_new_path_and_an_empty_directory_are_written(tmp_path):
    assert check_output(tmp_path / "new", kind="cache") == (tmp_path / "new").resolve()
    (tmp_path / "empty").mkdir()
    assert check_output(tmp_path / "empty", kind="cache") == (tmp_path / "empty").resolve()


def test_an_output_of_ours_of_the_same_kind_is_replaced(tmp_path):
    c = _cache(tmp_path / "c")
    (c / "train" / "shard_00001.bin.tmp-999999999").write_bytes(b"x")  # a killed run's temporary: ours
    assert check_output(c, kind="cache") == c.resolve()


@pytest.mark.parametrize("make, phrases", [
    (lambda d: (d.mkdir(), (d / "notes.txt").write_text("mine")), ("not an output of this library", "notes.txt")),
    (lambda d: d.write_text("a file"), ("a file, not a directory",)),
    (lambda d: (_cache(d), (d / "train" / "mine.txt").write_text("keep")), ("train/mine.txt", "does not list")),
    (lambda d: (d.mkdir(), (d / "meta.json").write_text("{broken")), ("not a readable record",)),
    (lambda d: (d.mkdir(), (d / "niels_receipt.json").write_text("{broken")),
     ("its niels_receipt.json is not a readable record",)),
    (lambda d: _cache(d / "pretrain" / "wiki") and _cache(d / "sft" / "chat", "sft"), ("root holding several outputs",)),
    (lambda d: (d.mkdir(), (d / "meta.json").write_text(json.dumps({"kind": "tokenizer"}))), ("tokenizer directory",)),
])
def test_anything_else_is_refused_naming_the_path_and_what_is_there(tmp_path, make, phrases):
    d = tmp_path / "out"
    make(d)
    before = sorted(p.as_posix() for p in tmp_path.rglob("*"))
    with pytest.raises(OutputRefused) as exc:
        check_output(d, kind="cache")
    message = str(exc.value)
    assert "\n" not in message and str(d) in message
    for phrase in phrases:
        assert phrase in message, message
    assert sorted(p.as_posix() for p in tmp_path.rglob("*")) == before


def test_the_current_directory_and_its_parents_are_refused(tmp_path, monkeypatch):
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    for out in (".", "..", "./", os.fspath(tmp_path / "here")):
        with pytest.raises(OutputRefused, match="current directory|above the current"):
            check_output(out, kind="cache")


@pytest.mark.parametrize("where", ["equal", "inside", "above"])
def test_an_output_that_overlaps_an_input_is_refused(tmp_path, where):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_text('{"text": "x"}\n')
    out = {"equal": data, "inside": data / "cache", "above": tmp_path}[where]
    with pytest.raises(OutputRefused, match="input"):
        check_output(out, kind="cache", inputs=[data])
    assert (data / "a.jsonl").read_text() == '{"text": "x"}\n'


def test_an_input_given_as_a_file_inside_the_output_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    f = out / "a.jsonl"
    f.write_text("{}\n")
    with pytest.raises(OutputRefused, match="holds the input"):
        check_output(out, kind="cache", inputs=[f])


def test_two_outputs_of_one_command_must_not_overlap(tmp_path):
    with pytest.raises(OutputRefused, match="must not overlap"):
        check_output(tmp_path / "out", kind="cache", others=[("--work-dir", tmp_path / "out" / "work")])
    check_output(tmp_path / "out", kind="cache", others=[("--work-dir", tmp_path / "out.work")])


def test_a_symlink_is_followed_to_its_directory_and_judged_there(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "thesis.tex").write_text("years of work")
    link = tmp_path / "link"
    link.symlink_to(user, target_is_directory=True)
    with pytest.raises(OutputRefused, match="thesis.tex"):
        check_output(link, kind="cache")
    cache = _cache(tmp_path / "cache")
    (tmp_path / "to-cache").symlink_to(cache, target_is_directory=True)
    assert check_output(tmp_path / "to-cache", kind="cache") == cache.resolve()


def test_dangling_and_looping_symlinks_are_refused(tmp_path):
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(OutputRefused, match="target is missing"):
        check_output(tmp_path / "dangling", kind="cache")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(OutputRefused, match="loops"):
        check_output(tmp_path / "loop", kind="cache")


def test_a_split_directory_of_a_cache_is_refused_as_part_of_that_cache(tmp_path):
    """cache/train: locate says "the train split of a pretrain cache"; the guard, which once called it a
    directory that is not ours, now says the same and names the cache to give instead."""
    c = _cache(tmp_path / "c")
    with pytest.raises(OutputRefused, match=r"the train split of the cache .*c \(its meta.json"):
        check_output(c / "train", kind="cache")
    assert (c / "train" / "shard_00000.bin").is_file()


def test_a_directory_with_both_markers_is_what_locate_says(tmp_path):
    """A directory holding manifest.json and meta.json: locate calls it packed bins (the manifest is read
    first), and so does the guard, which once read meta.json first and called it a cache."""
    from niels_gpt.locate import locate

    c = _cache(tmp_path / "c")
    (c / "manifest.json").write_text(json.dumps({"files": {}}))
    assert locate(c).kind == "packed"
    with pytest.raises(OutputRefused, match="packed SFT bins"):
        check_output(c, kind="cache")


def test_a_root_is_named_alike_by_locate_and_the_guard(tmp_path):
    """A directory whose only output of ours is a converted one two levels down: locate calls it a root, and
    the guard refuses it as one, naming the output below."""
    from niels_gpt.locate import locate

    conv = tmp_path / "runs" / "a" / "conv"
    conv.mkdir(parents=True)
    (conv / "niels_receipt.json").write_text("{}")
    assert locate(tmp_path / "runs").kind == "root"
    with pytest.raises(OutputRefused, match=r"root holding several outputs \(a/conv/\)"):
        check_output(tmp_path / "runs", kind="cache")
