"""Docs are code: every fenced ```python and ```bash block of README.md and docs/*.md runs as written.

Each block runs in a scratch directory holding `cache-demo/` (built once per session by
`python -m niels_gpt.demo --cache-dir cache-demo`, what `make demo` runs) and may write files there;
the venv's `python` comes first on PATH and the repository root is on PYTHONPATH. A block that cannot
run offline on a CPU is preceded by the line `<!-- docs-test: skip: REASON -->`, and the test shows
that reason when it skips it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)")
SKIP = re.compile(r"^<!--\s*docs-test:\s*skip:\s*(.+?)\s*-->\s*$")
LANGS = ("python", "bash")
BLOCK_TIMEOUT_S = 300


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


@pytest.fixture(scope="session")
def scratch(tmp_path_factory) -> Path:
    """A directory holding what `make demo` builds (cache-demo/ and the demo's training run).

    NIELS_GPT_DOCS_SCRATCH=DIR reuses a directory where the demo already ran (for editing docs)."""
    reuse = os.environ.get("NIELS_GPT_DOCS_SCRATCH")
    if reuse and (Path(reuse) / "cache-demo" / "tokenizer" / "meta.json").is_file():
        return Path(reuse)
    d = tmp_path_factory.mktemp("docs")
    r = subprocess.run([sys.executable, "-m", "niels_gpt.demo", "--cache-dir", "cache-demo"], cwd=d, env=_env(),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return d


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["NIELS_GPT_REPO"] = str(REPO)
    return env


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_docs_block_runs_as_written(block: Block, scratch: Path):
    if block.skip is not None:
        pytest.skip(f"{block.id}: {block.skip}")
    cmd = [sys.executable, "-c", block.code] if block.lang == "python" else [shutil.which("bash"), "-e", "-c", block.code]
    r = subprocess.run(cmd, cwd=scratch, env=_env(), capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    assert r.returncode == 0, (f"{block.id} ({block.lang}) exited {r.returncode}\n--- block ---\n{block.code}"
                               f"--- stdout ---\n{r.stdout[-3000:]}\n--- stderr ---\n{r.stderr[-3000:]}")
