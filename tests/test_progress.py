"""Progress bars: on a terminal (stderr) only unless asked for, with a real ETA where the input size is
known, and never the token budget as their total."""

import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.progress import should_show, text_input_bytes

SAMPLE = Path(__file__).resolve().parents[1] / "niels_gpt" / "sources" / "sample"


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_bars_show_on_a_terminal_only_unless_forced():
    assert should_show(None, FakeTTY()) is True
    assert should_show(None, io.StringIO()) is False
    assert should_show(True, io.StringIO()) is True and should_show(False, FakeTTY()) is False


def test_input_size_is_known_for_local_text_files_only(tmp_path):
    (tmp_path / "a.jsonl").write_text("x" * 10)
    (tmp_path / "b.txt").write_text("y" * 5)
    (tmp_path / "c.parquet").write_bytes(b"PAR1")
    assert text_input_bytes([tmp_path / "a.jsonl", tmp_path / "b.txt"]) == 15
    assert text_input_bytes([tmp_path / "a.jsonl", tmp_path / "c.parquet"]) is None  # compressed: no ETA
    assert text_input_bytes([]) is None


def test_the_bars_total_is_the_input_never_the_budget(tmp_path, tokenizer, capsys):
    docs = ["one short document"] * 20
    size = sum(len(d.encode()) for d in docs)
    build_pretrain_cache(docs, str(tmp_path / "a"), tokenizer=tokenizer, max_train_tokens=123_456_789,
                         max_val_tokens=0, shard_bytes=1 << 20, seed=0, shuffle_buffer=None, progress=True,
                         input_bytes=size)
    err = capsys.readouterr().err
    assert f"{size}/{size}" in err and "100%" in err and " tok, " in err
    assert "123M" not in err and "123456789" not in err
    build_pretrain_cache(docs, str(tmp_path / "b"), tokenizer=tokenizer, max_train_tokens=123_456_789,
                         max_val_tokens=0, shard_bytes=1 << 20, seed=0, shuffle_buffer=None, progress=True)
    err = capsys.readouterr().err
    assert "tok/s" in err and "%|" not in err and "123M" not in err  # a count and a rate, no total


def _cli(args, tmp_path, *, tty: bool) -> str:
    cmd = [sys.executable, "-m", "niels_gpt.cache.cli", *args]
    if not tty:
        r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=True)
        return r.stdout + r.stderr
    pid, fd = pty.fork()
    if pid == 0:  # the child: stderr is the pty, as in a terminal
        os.chdir(tmp_path)
        os.execv(sys.executable, cmd)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # tqdm draws nothing 0 wide
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out.decode()[-2000:]
    return out.decode().replace("\r", "\n")


def test_the_cli_shows_bars_on_a_terminal_and_none_in_a_pipe(tmp_path, tokenizer):
    args = ["build-all", "--sample", "--cache-dir", "c", "--only", "roam", "dolly15k",
            "--tokenizer", tokenizer.model_path]
    shown = _cli(args, tmp_path, tty=True)
    roam_bytes = sum(p.stat().st_size for p in (SAMPLE / "roam").glob("*.md"))
    assert "pretrain roam: 100%" in shown and f"/{roam_bytes / 1000:.0f}k" in shown and "Mtok/s" in shown
    assert "sft dolly15k: 34ex" in shown
    piped = _cli(["build-all", "--sample", "--cache-dir", "d", "--only", "roam", "--tokenizer", tokenizer.model_path],
                 tmp_path, tty=False)
    assert "%|" not in piped and "B/s" not in piped and "roam" in piped
