"""Nothing a user owns is ever deleted or replaced: every writer asks the one output guard first.

Each test puts a user's files where a careless command line points an output, runs the command through the
CLI, and checks the refusal (one `error:` line naming the path) and that every file is still there, byte
for byte. The last tests show what IS allowed: replacing an output of ours, writing through a symlink to a
directory, onto another filesystem.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from niels_gpt.cache.build_cache import build_pretrain_cache, build_sft_cache
from niels_gpt.cache.cli import main
from niels_gpt.meta import read_meta

from .conftest import sample_texts


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _data(d: Path, n: int = 12) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    rows = [json.dumps({"text": t}) for t in sample_texts()[:n] if t.strip()]
    (d / "part-000.jsonl").write_text("\n".join(rows) + "\n")
    return d


def _refused(argv: list[str], capsys, *phrases: str) -> str:
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: ") and sum("error: " in line for line in lines) == 1, err
    for phrase in phrases:
        assert phrase in lines[-1], (phrase, lines[-1])
    return lines[-1]


@pytest.fixture
def root_of_caches(tmp_path, tokenizer) -> Path:
    """A build-all root: the tokenizer, two caches and a user's own notes."""
    root = tmp_path / "cache"
    tok = root / "tokenizer"
    tok.mkdir(parents=True)
    shutil.copy(tokenizer.model_path, tok / "spm.model")
    shutil.copy(Path(tokenizer.model_path).parent / "meta.json", tok / "meta.json")
    build_pretrain_cache([t for t in sample_texts()[:6] if t.strip()], str(root / "pretrain" / "docs"),
                         tokenizer=tokenizer, max_train_tokens=4000, max_val_tokens=500, shard_bytes=4096, seed=0,
                         shuffle_buffer=None)
    build_sft_cache([[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]] * 4,
                    str(root / "sft" / "chat"), tokenizer=tokenizer, val_frac=0.0, seed=0)
    (root / "NOTES.md").write_text("my notes on this run\n")
    return root


def test_build_onto_a_root_of_caches_is_refused_and_deletes_nothing(root_of_caches, tmp_path, tokenizer, capsys):
    data = _data(tmp_path / "data")
    before = _tree(root_of_caches)
    _refused(["build", str(data), "--out", str(root_of_caches), "--tokenizer", tokenizer.model_path,
              "--no-progress"], capsys, str(root_of_caches), "several outputs")
    assert _tree(root_of_caches) == before


@pytest.mark.parametrize("suffix", ["", "/."])
def test_build_of_a_directory_into_itself_is_refused(tmp_path, tokenizer, capsys, suffix):
    data = _data(tmp_path / "data")
    before = _tree(data)
    _refused(["build", str(data), "--out", str(data) + suffix, "--tokenizer", tokenizer.model_path,
              "--no-progress"], capsys, "input")
    assert _tree(data) == before


def test_build_into_the_input_directory_is_refused(tmp_path, tokenizer, capsys):
    data = _data(tmp_path / "data")
    _refused(["build", str(data), "--out", str(data / "cache"), "--tokenizer", tokenizer.model_path,
              "--no-progress"], capsys, "inside the input directory")
    assert sorted(p.name for p in data.iterdir()) == ["part-000.jsonl"]


def test_an_output_directory_holding_a_users_file_is_refused(tmp_path, tokenizer, capsys):
    data = _data(tmp_path / "data")
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work\n")
    _refused(["build", str(data), "--out", str(out), "--tokenizer", tokenizer.model_path, "--no-progress"],
             capsys, str(out), "thesis.tex")
    assert _tree(out) == {"thesis.tex": b"years of work\n"}
    assert not (tmp_path / "out.build").exists()


def test_build_never_deletes_a_work_dir_it_did_not_make(tmp_path, tokenizer, capsys):
    data = _data(tmp_path / "data")
    work = tmp_path / "work"
    work.mkdir()
    (work / "todo.txt").write_text("mine\n")
    argv = ["build", str(data), "--out", str(tmp_path / "out"), "--tokenizer", tokenizer.model_path,
            "--workers", "1", "--executor", "processes", "--no-progress", "--val-tokens", "0"]
    _refused([*argv, "--work-dir", str(work)], capsys, "--work-dir", "todo.txt")
    assert _tree(work) == {"todo.txt": b"mine\n"}
    # an empty directory the user made: used, emptied of what the build wrote, and kept
    empty = tmp_path / "empty-work"
    empty.mkdir()
    assert main([*argv, "--work-dir", str(empty)]) == 0
    assert empty.is_dir() and list(empty.iterdir()) == []
    # the default work directory is the build's own: removed after the commit
    assert main([*argv, "--out", str(tmp_path / "out2")]) == 0
    assert not (tmp_path / "out2.build").exists() and (tmp_path / "out2" / "meta.json").is_file()


def test_build_work_dir_inside_the_output_is_refused(tmp_path, tokenizer, capsys):
    data = _data(tmp_path / "data")
    out = tmp_path / "out"
    _refused(["build", str(data), "--out", str(out), "--tokenizer", tokenizer.model_path, "--workers", "1",
              "--executor", "processes", "--no-progress", "--work-dir", str(out / "work")], capsys,
             "must not overlap")
    assert not out.exists()


def test_convert_and_pack_sft_refuse_a_users_directory(root_of_caches, tmp_path, capsys):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine\n")
    _refused(["convert", str(root_of_caches / "pretrain" / "docs"), str(dst), "--to", "nanogpt"], capsys, "keep.txt")
    _refused(["pack-sft", str(root_of_caches / "sft" / "chat"), str(dst), "--pack-size", "128"], capsys, "keep.txt")
    _refused(["pack-sft", str(root_of_caches / "sft" / "chat"), str(root_of_caches / "sft" / "chat"),
              "--pack-size", "128"], capsys, "input")
    assert _tree(dst) == {"keep.txt": b"mine\n"}


def test_build_all_refuses_a_cache_path_that_holds_a_users_file(tmp_path, tokenizer, capsys):
    cache_dir = tmp_path / "c"
    (cache_dir / "pretrain" / "wikitext").mkdir(parents=True)
    (cache_dir / "pretrain" / "wikitext" / "draft.txt").write_text("mine\n")
    _refused(["build-all", "--cache-dir", str(cache_dir), "--sample", "--only", "wikitext", "--tokenizer",
              tokenizer.model_path, "--no-progress"], capsys, "draft.txt")
    assert (cache_dir / "pretrain" / "wikitext" / "draft.txt").read_text() == "mine\n"


def test_build_all_refuses_a_cache_dir_around_its_own_input(tmp_path, tokenizer, capsys):
    roam = tmp_path / "c" / "pretrain" / "roam"
    roam.mkdir(parents=True)
    (roam / "note.md").write_text("# a note\n\nsome text\n")
    _refused(["build-all", "--cache-dir", str(tmp_path / "c"), "--roam-dir", str(roam), "--only", "roam",
              "--tokenizer", tokenizer.model_path, "--no-progress"], capsys, "input")
    assert (roam / "note.md").is_file()


def test_build_all_tokenizer_step_refuses_a_users_directory(tmp_path, tokenizer, capsys):
    (tmp_path / "c" / "tokenizer").mkdir(parents=True)
    (tmp_path / "c" / "tokenizer" / "vocab-notes.txt").write_text("mine\n")
    _refused(["build-all", "--cache-dir", str(tmp_path / "c"), "--only", "tokenizer", "--tokenizer",
              tokenizer.model_path, "--no-progress"], capsys, "vocab-notes.txt")


def test_a_symlink_to_a_users_directory_is_judged_by_its_target(tmp_path, tokenizer, capsys):
    data = _data(tmp_path / "data")
    user = tmp_path / "user"
    user.mkdir()
    (user / "photo.jpg").write_bytes(b"\xff\xd8jpeg")
    (tmp_path / "link").symlink_to(user, target_is_directory=True)
    _refused(["build", str(data), "--out", str(tmp_path / "link"), "--tokenizer", tokenizer.model_path,
              "--no-progress"], capsys, "photo.jpg")
    assert _tree(user) == {"photo.jpg": b"\xff\xd8jpeg"}


def test_a_symlink_to_a_cache_is_rebuilt_where_it_points(tmp_path, tokenizer):
    data = _data(tmp_path / "data")
    real = tmp_path / "real"
    argv = ["build", str(data), "--tokenizer", tokenizer.model_path, "--no-progress"]
    assert main([*argv, "--out", str(real)]) == 0
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    assert main([*argv, "--out", str(tmp_path / "link"), "--max-tokens", "1000"]) == 0
    assert (tmp_path / "link").is_symlink() and read_meta(str(real))["totals"]["train_tokens"] == 1000


def test_an_output_of_ours_is_replaced_and_a_stray_file_in_it_stops_that(tmp_path, tokenizer, capsys):
    data = _data(tmp_path / "data")
    out = tmp_path / "out"
    argv = ["build", str(data), "--out", str(out), "--tokenizer", tokenizer.model_path, "--no-progress"]
    assert main(argv) == 0
    assert main([*argv, "--max-tokens", "500"]) == 0
    assert read_meta(str(out))["totals"]["train_tokens"] == 500
    (out / "train" / "analysis.ipynb").write_text("{}")
    _refused(argv, capsys, "train/analysis.ipynb", "does not list")
    assert (out / "train" / "analysis.ipynb").is_file() and read_meta(str(out))["totals"]["train_tokens"] == 500


def test_an_output_on_another_filesystem(tmp_path, tokenizer):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode})")
    try:
        data = _data(tmp_path / "data")
        argv = ["build", str(data), "--out", str(mnt / "c"), "--tokenizer", tokenizer.model_path, "--no-progress"]
        assert main(argv) == 0 and main(argv) == 0  # built, then replaced, on the other filesystem
        assert sorted(p.name for p in mnt.iterdir()) == ["c"]
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
