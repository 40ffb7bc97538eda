"""What each --on-overflow policy loses at one pack size on the real chat data (dolly, oasst1).

Caches: the shared dolly and oasst1 conversations built with build_sft_cache and bench_packing.py's tokenizer
(sentencepiece, 8k pieces, trained on the shared corpora). For each policy, the examples longer than the pack
size, the tokens and trained targets no packed sequence holds, and what is packed:

- truncate keeps the first PACK_SIZE tokens of a long conversation;
- reject refuses the run: to pack at all, the long conversations must be dropped, so all their tokens count;
- split cuts between whole turns, each piece repeating the system prompt; a turn that does not fit alone is
  cut, and a piece left with no assistant turn is dropped.

    .venv/bin/python bench/bench_overflow.py [PACK_SIZE]     # needs ../shared/data; about a minute on 2 cores
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from niels_gpt.packing import pack_sft
from niels_gpt.packing.source import open_sft_split
from niels_gpt.packing.truncation import truncation_figures
from niels_gpt.tokenizer import TrainSettings, train_tokenizer

sys.path.insert(0, str(Path(__file__).parent))
from bench_packing import DATA, corpus_texts, real_caches  # noqa: E402

POLICIES = ("truncate", "reject", "split")


def figures(cache: Path, out: Path, pack_size: int, policy: str) -> dict:
    split = open_sft_split(cache, "train")
    if policy == "reject":  # what packing at all costs: every token of every example over the pack size
        over = split.lengths > pack_size
        t = truncation_figures(split, pack_size)
        lost = int(split.lengths[over].sum())
        return {"over": int(over.sum()), "tokens": t["tokens"], "tokens_lost": lost, "targets_lost": None,
                "sequences": int((~over & (split.lengths > 0)).sum())}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = pack_sft(cache, out, pack_size=pack_size, on_overflow=policy, val=False)
    t = m["truncation"]
    return {"over": int((split.lengths > pack_size).sum()), "tokens": t["tokens"], "tokens_lost": t["tokens_lost"],
            "targets_lost": (t["trained_targets_lost"], t["trained_targets"]), "sequences": m["num_sequences"]}


def main() -> int:
    pack_size = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    if not DATA.is_dir():
        print(f"{DATA} is absent: this benchmark needs the real corpora", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="bench_overflow_") as tmp:
        work = Path(tmp)
        tok = train_tokenizer(corpus_texts(), work / "tok", settings=TrainSettings(vocab_size=8000))
        caches = real_caches(work, tok)
        print(f"pack size {pack_size}; tokenizer {len(tok)} ids")
        print("| data | policy | examples over | tokens lost | trained targets lost | packed sequences |")
        print("|---|---|---|---|---|---|")
        for name in ("dolly", "oasst"):
            for policy in POLICIES:
                f = figures(caches[name], work / f"p-{name}-{policy}", pack_size, policy)
                share = f"{f['tokens_lost']:,} of {f['tokens']:,} ({f['tokens_lost'] / f['tokens']:.1%})"
                tl = f["targets_lost"]
                targets = ("all of those examples'" if tl is None else
                           f"{tl[0]:,} of {tl[1] or 0:,} ({tl[0] / tl[1]:.1%})" if tl[1] else "0")
                print(f"| {name} | {policy} | {f['over']} | {share} | {targets} | {f['sequences']:,} |")
    return 0


if __name__ == "__main__":
    np.set_printoptions(linewidth=120)
    sys.exit(main())
