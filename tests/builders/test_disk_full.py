"""A disk that fills during a rebuild: one line naming the file being written and the space free there, and
the previous cache left as it was. A full disk cannot be made safely in a test, so the part writer's write
raises ENOSPC, as the kernel would (the process pool forks, so its workers inherit the patch)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from niels_gpt.cache.cli import main
from niels_gpt.formats.writers import HashingFile

from ..conftest import sample_texts


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("executor", ["processes", "inline"])
def test_a_full_disk_during_a_rebuild_is_one_line_and_keeps_the_old_cache(tokenizer, tmp_path, capsys, monkeypatch,
                                                                         executor):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts()[:12] if t.strip()))
    argv = ["build", str(data), "--out", str(tmp_path / "c"), "--tokenizer", tokenizer.model_path, "--no-progress",
            "--executor", executor, "--workers", "2", "--task-bytes", "20000"]
    assert main(argv) == 0
    before = _tree(tmp_path / "c")

    def full(self, arr):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.tmp))

    monkeypatch.setattr(HashingFile, "write", full)
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if "error: " in line]
    assert "Traceback" not in err and len(errors) == 1 and errors[0] == lines[-1], err
    lines = errors
    if executor == "processes":
        assert "disk full writing " in lines[0] and ".bin" in lines[0] and "free " in lines[0], lines[0]
        assert "the cache was not changed" in lines[0] and "--work-dir" in lines[0]
    else:
        assert "no space left on device" in lines[0] and "free there now" in lines[0], lines[0]
    assert _tree(tmp_path / "c") == before
