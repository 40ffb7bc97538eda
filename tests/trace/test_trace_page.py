"""The page of a traced step, loaded in a real headless browser (Debian's chromium): no console message, one
section per sequence and one marked span per document in the browser's DOM, and a screenshot kept with the
test's output.

The browser is installed here when it is missing and it can be (root, apt-get; once, within a time limit);
the test is skipped, naming why, only where no browser can be had.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from niels_gpt.train.train import TrainConfig, train

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
INSTALL_S = 600


@pytest.fixture(scope="session")
def browser() -> str:
    found = next(filter(None, map(shutil.which, BROWSERS)), None)
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("no chromium, and no way to install it here (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    deadline = time.monotonic() + INSTALL_S
    try:
        # a fresh image may hold no package lists: update once, then install again
        for cmd in (["apt-get", "install", "-y", "chromium"], ["apt-get", "update"],
                    ["apt-get", "install", "-y", "chromium"]):
            if subprocess.run(cmd, capture_output=True, timeout=max(1.0, deadline - time.monotonic()),
                              env=env).returncode == 0 and cmd[1] == "install":
                break
    except subprocess.TimeoutExpired:
        pytest.skip(f"apt-get could not install chromium within {INSTALL_S} s")
    found = next(filter(None, map(shutil.which, BROWSERS)), None)
    if not found:
        pytest.skip("apt-get could not install chromium (no package source reachable?)")
    return found


def load(browser: str, page: Path, screenshot: Path | None = None) -> tuple[str, list[str]]:
    """(the DOM chromium built from `page`, its console messages)."""
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]
    out = subprocess.run([*flags, "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    if screenshot is not None:
        subprocess.run([*flags, f"--screenshot={screenshot}", "--window-size=1400,1600", page.resolve().as_uri()],
                       capture_output=True, timeout=120)
    return out.stdout, [line for line in out.stderr.splitlines() if ":CONSOLE" in line]


class Count(HTMLParser):
    def __init__(self):
        super().__init__()
        self.classes: dict[str, int] = {}

    def handle_starttag(self, tag, attrs):
        for c in (dict(attrs).get("class") or "").split():
            self.classes[c] = self.classes.get(c, 0) + 1


def test_the_console_check_sees_a_page_that_logs(browser, tmp_path):
    page = tmp_path / "bad.html"
    page.write_text("<!doctype html><p>x</p><script>console.error('broken')</script>")
    assert any("broken" in line for line in load(browser, page)[1])


def test_the_page_of_a_step_loads_clean_with_every_sequence_and_document(browser, tmp_path, sft_cache, request):
    run = tmp_path / "run"
    train(TrainConfig(data=str(sft_cache), out_dir=str(run), depth=1, n_embd=32, n_head=2, sequence_len=16,
                      device_batch_size=4, steps=2, eval_steps=1, log_every=0),
          token_bytes=torch.ones(2004, dtype=torch.int64), log=lambda *a: None)
    from niels_gpt.trace import trace_step

    trace = trace_step(run, 2)
    page = tmp_path / "step2.html"
    # the handmade cache has no tokenizer: ids are shown as numbers
    from niels_gpt.trace.cli import render_page

    page.write_text(render_page(trace, lambda ids: " ".join(map(str, ids)) + " "))
    out = Path(os.environ.get("TRACE_PAGE_OUT", tmp_path))
    shot = out / f"{request.node.name}.png"
    dom, console = load(browser, page, shot)
    counted = Count()
    counted.feed(dom)
    assert console == []
    assert counted.classes["sequence"] == len(trace["sequences"]) == 4
    assert counted.classes["doc"] == sum(len(s["documents"]) for s in trace["sequences"])
    assert counted.classes["untrained"] >= 4  # every SFT row opens with an untrained user turn
    assert "http" not in dom.split("<body")[0]  # nothing fetched from elsewhere
    assert shot.is_file() and shot.stat().st_size > 1000
    print(f"screenshot: {shot}", file=sys.stderr)
