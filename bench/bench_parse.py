"""Reading JSON Lines into documents, without the encoder: msgspec against json, per line, in one run.

    python bench/bench_parse.py [FILE.jsonl ...]    # default: debian-docs, and its paragraphs as short lines

For each file: seconds of CPU (best of --repeat) of `json_lines` (read + parse a byte range), and of
`json_lines` + the text layout (`items`), with msgspec and with json alone, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT.parent / "shared" / "data" / "bulk-text" / "debian-docs.jsonl"


def cpu(fn, repeat: int) -> float:
    best = None
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        dt = time.process_time() - t0
        best = dt if best is None else min(best, dt)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    from niels_gpt.sources import lines
    from niels_gpt.sources.documents import Rules, items

    with tempfile.TemporaryDirectory(prefix="bench-parse-") as tmp:
        files = args.files
        if not files:
            short = Path(tmp) / "debian-docs-paragraphs.jsonl"
            with open(DATA, encoding="utf-8") as f, open(short, "w", encoding="utf-8") as out:
                for line in f:
                    for p in json.loads(line)["text"].split("\n\n"):
                        if p.strip():
                            out.write(json.dumps({"text": p, "id": "x", "meta": {"a": 1}}) + "\n")
            files = [DATA, short]
        fast = lines._fast_loads
        print(f"msgspec: {'installed' if fast else 'not installed'}")
        for path in files:
            piece = SimpleNamespace(item=str(path), start=0, stop=os.path.getsize(path), kind=".jsonl")
            n = sum(1 for _ in lines.json_lines(piece, None))
            row = []
            for what, fn in (("read+parse", lambda piece=piece: sum(1 for _ in lines.json_lines(piece, None))),
                             ("+text layout", lambda piece=piece: sum(1 for _ in items(lines.json_lines(piece, None), "text",
                                                                                         Rules())))):
                times = {}
                for name, loads in (("msgspec", fast), ("json", None)):
                    if name == "msgspec" and fast is None:
                        continue
                    lines._fast_loads = loads
                    times[name] = cpu(fn, args.repeat)
                lines._fast_loads = fast
                ratio = f", {times['json'] / times['msgspec']:.1f}x" if "msgspec" in times else ""
                row.append(f"{what}: " + ", ".join(f"{k} {v:.2f} s ({v / n * 1e6:.2f} us/line)"
                                                   for k, v in times.items()) + ratio)
            print(f"{path.name} ({n:,} lines, {os.path.getsize(path) / 1e6:.0f} MB): " + "; ".join(row))


if __name__ == "__main__":
    main()
