"""How long `train-tokenizer SRC... --out DIR` takes on real corpora, phase by phase, against its own estimate.

On ../shared/data's debian-docs (46.7 MB of JSONL) and Gutenberg books (10 MB of text), together ~55 MB: what
`train-tokenizer` runs (`train_on_sources`, progress on), timed from here; the reading phase ends when the
`tokenizer: training (... about N s)` line appears on stderr.
Prints wall time, characters read, characters/s of the training phase, and the estimate the command showed
against the real training time (the constant SECONDS_PER_MCHAR in niels_gpt/builders/tokenizer.py).

    .venv/bin/python bench/bench_tokenizer_training.py                    # ~6-8 min on 2 cores, vocab 16000
    .venv/bin/python bench/bench_tokenizer_training.py --vocab 4000 --only gutenberg
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
CORPORA = {"debian-docs": SHARED / "bulk-text" / "debian-docs.jsonl", "gutenberg": SHARED / "gutenberg"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--vocab", type=int, default=16_000, help="--vocab-size")
    ap.add_argument("--model-type", default="unigram", choices=("unigram", "bpe"))
    ap.add_argument("--only", nargs="+", default=list(CORPORA), choices=list(CORPORA), help="corpora to train on")
    args = ap.parse_args(argv)
    sources = [CORPORA[name] for name in args.only]
    if not all(p.exists() for p in sources):
        print(f"{SHARED} is absent; this benchmark needs ../shared/data")
        return 1
    size = sum(p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
               for p in sources)
    from niels_gpt.builders.tokenizer import train_on_sources
    from niels_gpt.tokenizer import TrainSettings

    class Clock(io.StringIO):
        """stderr that notes when the training phase's line first appears."""

        seen_at: float | None = None

        def write(self, text: str) -> int:
            if self.seen_at is None and "tokenizer: training (" in text:
                self.seen_at = time.perf_counter()
            return super().write(text)

    err = Clock()
    with tempfile.TemporaryDirectory(prefix="bench-tok-") as tmp:
        t0 = time.perf_counter()
        with contextlib.redirect_stderr(err):
            train_on_sources(sources, Path(tmp) / "tok", progress=True,
                             settings=TrainSettings(vocab_size=args.vocab, model_type=args.model_type))
        wall = time.perf_counter() - t0
        meta = json.loads((Path(tmp) / "tok" / "meta.json").read_text())
    read_done = None if err.seen_at is None else err.seen_at - t0
    m = re.search(r"about (\d+) s", err.getvalue())
    estimate = int(m.group(1)) if m else None
    chars = meta["training_text"]["characters"]
    train_s = wall - (read_done or 0.0)
    print(f"corpora: {', '.join(args.only)}: {size / 1e6:.1f} MB on disk, {chars / 1e6:.1f} M characters read")
    print(f"vocab {args.vocab} ({args.model_type}): {wall:.0f} s in all; reading {read_done or float('nan'):.0f} s, "
          f"training {train_s:.0f} s = {train_s / (chars / 1e6):.2f} s per million characters")
    if estimate is not None:
        print(f"the command's estimate of the training phase: {estimate} s ({estimate / train_s:.2f}x the real time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
