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
from niels_gpt.progress import should_show

SAMPLE = Path(__file__).resolve().parents[1] / "niels_gpt" / "sources" / "sample"


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_bars_show_on_a_terminal_only_unless_forced():
    assert should_show(None, FakeTTY()) is True
    assert should_show(None, io.StringIO()) is False
    assert should_show(True, io.StringIO()) is True and should_show(False, FakeTTY()) is False


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


# ---------------------------------------------------------------------------------------------
# Outside a terminal: a line every so often, with rate and ETA


def test_outside_a_terminal_a_line_comes_every_few_seconds_with_rate_and_eta():
    from niels_gpt.progress import Lines, mode

    assert mode(None, FakeTTY()) == "bar" and mode(None, io.StringIO()) == "lines"
    assert mode(False, io.StringIO()) == "off" and mode(True, io.StringIO()) == "bar"
    now = [100.0]
    out = io.StringIO()
    bar = Lines(desc="build", total=1000, unit="B", every=30, stream=out, clock=lambda: now[0])
    bar.update(100)
    assert out.getvalue() == ""  # not yet due
    now[0] += 30
    bar.update(200)
    line = out.getvalue().strip()
    assert line.startswith("build: 300 B of 1.0 kB (30%), 10 B/s, ETA 0:01:10") and "0:00:30 elapsed" in line
    bar.set_postfix_str("1,234 tok")
    now[0] += 40
    bar.update(700)
    bar.close()
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 3 and "1.0 kB of 1.0 kB (100%)" in lines[-1] and lines[-1].endswith("; 1,234 tok")


def test_a_short_job_in_a_log_prints_no_progress_line():
    from niels_gpt.progress import Lines

    out = io.StringIO()
    bar = Lines(range(3), desc="x", every=30, stream=out, clock=lambda: 0.0)
    assert list(bar) == [0, 1, 2] and bar.n == 3
    bar.close()
    assert out.getvalue() == ""


def test_the_parallel_builds_bar_shows_by_default_on_a_terminal_and_as_lines_in_a_log(monkeypatch):
    from niels_gpt.builders.parallel import Progress
    from niels_gpt.progress import Lines

    monkeypatch.setattr(sys, "stderr", FakeTTY())
    bar = Progress(3, 0, None).bar
    assert not isinstance(bar, Lines) and not bar.disable  # it was disabled by its own default
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert isinstance(Progress(3, 0, None).bar, Lines)
    assert Progress(3, 0, False).bar.disable


def test_build_and_train_tokenizer_print_progress_lines_into_a_log(tmp_path, monkeypatch, capsys):
    import json

    from niels_gpt.cache.cli import main

    monkeypatch.setenv("NIELS_GPT_PROGRESS_EVERY", "0")  # a line at every update: due at once
    d = tmp_path / "d"
    d.mkdir()
    texts = [p.read_text() for p in sorted((SAMPLE / "roam").glob("*.md"))[:6]]
    (d / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    assert main(["train-tokenizer", str(d), "--out", str(tmp_path / "tok"), "--vocab-size", "400"]) == 0
    err = capsys.readouterr().err
    assert "tokenizer: reading text: " in err and "char/s" in err and "tokenizer: training (" in err
    assert main(["build", str(d), "--out", str(tmp_path / "c"), "--tokenizer", str(tmp_path / "tok"),
                 "--executor", "inline"]) == 0
    captured = capsys.readouterr()
    assert "pretrain c: " in captured.err and "B/s" in captured.err and "ETA" in captured.err
    assert "executor inline: 1 task(s), 1 ran, 0 reused" in captured.out  # not "0 ran" for the task it ran


def test_a_bar_that_is_off_passes_items_through_and_imports_no_tqdm():

    code = ("import sys\nfrom niels_gpt.progress import BuildProgress, progress_bar\n"
            "bar = progress_bar(range(3), progress=False, desc='x')\nassert list(bar) == [0, 1, 2] and bar.disable\n"
            "bar.update(5); bar.set_postfix_str('y'); bar.refresh(); bar.close()\n"
            "b = BuildProgress('x', progress=False, input_bytes=10)\nassert list(b.documents(['a'])) == ['a']\n"
            "b.add_tokens(3); b.close(finished=True)\nprint('tqdm' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
