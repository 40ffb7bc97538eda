"""Bytes do not move when code does: every output and batch matches the digests recorded in
tests/golden/outputs.json (written by tests/golden_outputs.py before the package was re-layered).

Regenerate that file only for a change that is meant to change bytes, and say so in the changelog:
    .venv/bin/python tests/golden_outputs.py tests/golden/outputs.json
"""

import json
from pathlib import Path

from .golden_outputs import outputs

GOLDEN = Path(__file__).parent / "golden" / "outputs.json"


def test_every_output_and_batch_matches_the_recorded_digests(tmp_path):
    want = json.loads(GOLDEN.read_text())
    got = outputs(tmp_path)
    assert sorted(got) == sorted(want), "outputs written or missing: " + ", ".join(sorted(set(got) ^ set(want)))
    changed = [k for k in sorted(want) if got[k] != want[k]]
    assert not changed, f"{len(changed)} of {len(want)} outputs changed bytes: {', '.join(changed[:20])}"
    assert len(want) > 200 and any(k.startswith("batch/") for k in want)
