"""A reduced, seeded run of the reliability campaign (bench/campaign.py; the full run is in docs/architecture.md):
writers (builds, pack-sft, convert) killed at random moments never leave a complete-looking partial output, the
same command run again succeeds with nothing removed by hand and writes the same bytes, no
temporaries or locks stay behind; no size/count/header change makes a reader serve different data silently;
two builds into one output and a reader during a rebuild behave."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    out = tmp_path_factory.mktemp("campaign") / "figures.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "campaign.py"), "--kills", "1", "--flips", "4",
                        "--seed", "3", "--only", "pretrain over", "sft fresh", "pack-sft over", "convert nanogpt over",
                        "convert megatron", "build processes over", "train-tokenizer fresh",
                        "train-tokenizer sampled over", "train-tokenizer rustbpe over", "--json", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print(r.stdout)
    return json.loads(out.read_text())


def test_kills_leave_nothing_complete_looking_and_reruns_are_byte_identical(figures):
    t = figures["kill_totals"]
    assert t["reruns"] == len(figures["kills"]) == 9  # one kill of each job: the full run is bench/campaign.py
    assert t.get("rerun failed", 0) == 0, [r.get("rerun errors") for r in figures["kills"]]  # nothing cleaned by hand
    assert t.get("complete-looking partial", 0) == 0
    assert t.get("rerun differs from clean", 0) == 0
    assert t.get("leftovers after rerun", 0) == 0
    assert t.get("partial refused by verify", 0) == t.get("partial outputs", 0)
    assert t.get("partial refused by reader", 0) == t.get("partial outputs", 0)


def test_no_size_count_or_header_change_is_served_silently(figures):
    t = figures["corruption_totals"]
    assert t["changes"] > 100
    assert t.get("silently different: size/count/header", 0) == 0, figures["corruption"]
    assert t.get("reader crashed (not a package error)", 0) == 0
    assert t.get("missed by verify but used by a reader", 0) == 0


def test_races_are_refused_or_served_whole(figures):
    r = figures["races"]
    assert r["two builds: exit codes"] == [0, 1] and r["two builds: refused with a lock message"] == 1
    assert r["two builds: final cache verifies"] is True
    assert r["reader during rebuild: other exceptions"] == 0


def test_verify_catches_every_single_change_to_every_file_of_an_output(figures):
    """Records included (meta.json, manifest.json, niels_receipt.json): each carries its own checksum."""
    by_file = figures["corruption_by_file"]
    assert {"meta.json", "manifest.json", "niels_receipt.json"} <= set(by_file)
    missed = {k: v for k, v in by_file.items() if v.get("caught by verify", 0) != v["changes"]}
    assert not missed, missed
