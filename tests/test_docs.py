"""Docs are code: every fenced ```python and ```bash block of README.md and docs/*.md runs as written.

The blocks run in order in one scratch directory and may write files there; the venv's `python` comes
first on PATH and the repository root is on PYTHONPATH. A block that names what `make demo` writes
(`cache-demo/`, `runs/demo`) runs once `python -m niels_gpt.demo --cache-dir cache-demo` has run there
(once per session); the others run without waiting for it, and do not fail with it. A block that cannot
run offline on a CPU is preceded by the line `<!-- docs-test: skip: REASON -->`, and the test shows
that reason when it skips it.

The demo and each block are stopped only when they print nothing for STALL_S seconds (a busy machine
slows them; it does not silence them), never for their total time.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)")
SKIP = re.compile(r"^<!--\s*docs-test:\s*skip:\s*(.+?)\s*-->\s*$")
LANGS = ("python", "bash")
STALL_S = float(os.environ.get("NIELS_GPT_DOCS_STALL_S", 300))  # no output for this long: stopped, a failure
DEMO_OUTPUTS = ("cache-demo", "runs/demo")  # what `python -m niels_gpt.demo --cache-dir cache-demo` writes


@dataclass
class Block:
    path: Path
    line: int
    lang: str
    code: str
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def needs_demo(self) -> bool:
        return any(name in self.code for name in DEMO_OUTPUTS)


def blocks_of(path: Path) -> list[Block]:
    out, lines = [], path.read_text("utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if lang in LANGS:
            prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
            skip = SKIP.match(prev.strip())
            out.append(Block(path, start + 1, lang, "\n".join(lines[start + 1:j]) + "\n",
                             skip.group(1) if skip else None))
        i = j + 1
    return out


BLOCKS = [b for p in DOCS for b in blocks_of(p)]


def test_the_docs_have_blocks_to_run():
    assert len([b for b in BLOCKS if b.skip is None]) >= 10


def test_a_silent_command_is_stopped_by_the_stall_limit_and_a_talking_one_is_not(tmp_path):
    talks = "import time\nfor _ in range(6):\n    print('.', flush=True); time.sleep(0.4)\n"  # 2.4 s in all
    assert run_watched([sys.executable, "-c", talks], tmp_path, "talks", stall_s=1.0).returncode == 0
    with pytest.raises(pytest.fail.Exception, match=r"silent: no output for 1 s, stopped"):
        run_watched([sys.executable, "-c", "print('start', flush=True); import time; time.sleep(30)"], tmp_path,
                    "silent", stall_s=1.0)


def run_watched(cmd: list[str], cwd: Path, what: str, stall_s: float = STALL_S) -> subprocess.CompletedProcess:
    """Run `cmd` to its end, stopping it only when it prints nothing (stdout or stderr) for `stall_s` seconds."""
    p = subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    last, chunks = [time.monotonic()], {"out": [], "err": []}

    def pump(stream, into):
        for line in stream:
            into.append(line)
            last[0] = time.monotonic()

    readers = [threading.Thread(target=pump, args=(p.stdout, chunks["out"]), daemon=True),
               threading.Thread(target=pump, args=(p.stderr, chunks["err"]), daemon=True)]
    for t in readers:
        t.start()
    while p.poll() is None:
        if time.monotonic() - last[0] > stall_s:
            p.kill()
            p.wait()
            pytest.fail(f"{what}: no output for {stall_s:.0f} s, stopped (NIELS_GPT_DOCS_STALL_S sets the limit)\n"
                        f"--- stdout ---\n{''.join(chunks['out'])[-3000:]}\n--- stderr ---\n"
                        f"{''.join(chunks['err'])[-3000:]}")
        time.sleep(0.2)
    for t in readers:
        t.join()
    return subprocess.CompletedProcess(cmd, p.returncode, "".join(chunks["out"]), "".join(chunks["err"]))


@pytest.fixture(scope="session")
def scratch(tmp_path_factory) -> Path:
    """The directory every block runs in.

    NIELS_GPT_DOCS_SCRATCH=DIR reuses a directory where the demo already ran (for editing docs)."""
    reuse = os.environ.get("NIELS_GPT_DOCS_SCRATCH")
    if reuse and (Path(reuse) / "cache-demo" / "tokenizer" / "meta.json").is_file():
        return Path(reuse)
    return tmp_path_factory.mktemp("docs")


@pytest.fixture(scope="session")
def demo(scratch: Path) -> Path:
    """`scratch` once it holds what `make demo` builds (cache-demo/ and the demo's training runs)."""
    if not (scratch / "cache-demo" / "tokenizer" / "meta.json").is_file():
        r = run_watched([sys.executable, "-m", "niels_gpt.demo", "--cache-dir", "cache-demo"], scratch, "make demo")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return scratch


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["NIELS_GPT_REPO"] = str(REPO)
    return env


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_docs_block_runs_as_written(block: Block, scratch: Path, request):
    if block.skip is not None:
        pytest.skip(f"{block.id}: {block.skip}")
    if block.needs_demo:
        request.getfixturevalue("demo")
    cmd = [sys.executable, "-c", block.code] if block.lang == "python" else [shutil.which("bash"), "-e", "-c", block.code]
    r = run_watched(cmd, scratch, block.id)
    assert r.returncode == 0, (f"{block.id} ({block.lang}) exited {r.returncode}\n--- block ---\n{block.code}"
                               f"--- stdout ---\n{r.stdout[-3000:]}\n--- stderr ---\n{r.stderr[-3000:]}")
