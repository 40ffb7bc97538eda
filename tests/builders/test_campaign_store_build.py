"""A reduced, seeded run of the kill campaign for builds through an s3:// work URL (bench/campaign_store_build.py,
moto's S3 server): a build killed at a random moment leaves no complete-looking cache at the output URL, and the
same command run again succeeds, writes the same objects as a clean run, empties the work URL and leaves no
temporary directory behind."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")


def test_killed_store_builds_rerun_to_the_clean_cache(tmp_path):
    out = tmp_path / "figures.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "campaign_store_build.py"), "--kills", "1", "--seed", "3",
                        "--only", "processes", "--json", str(out)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    t = json.loads(out.read_text())["kill_totals"]
    assert t["reruns"] == 1
    for bad in ("complete-looking partial", "rerun failed", "rerun differs from clean", "work URL not emptied",
                "leftovers in the temporary directory"):
        assert t.get(bad, 0) == 0, (bad, t)
