"""`pack-sft`: pack one split of an SFT cache into a memmap_padded_v1 shard (the train split: its val split
too, into OUT/val/, unless --no-val). OUT may be an fsspec URL.

    python -m niels_gpt.cli pack-sft cache/sft/dolly15k packed/dolly15k-train --seq-len 4096 --algorithm ffd
"""

from __future__ import annotations

import argparse
import sys

from niels_gpt.args import hidden_alias
from niels_gpt.constants import SPLITS
from niels_gpt.packing.algorithms import ALGORITHMS, DEFAULT_ALGORITHM, DEFAULT_PACK_SIZE, DEFAULT_SEED
from niels_gpt.packing.pack import DEFAULT_ON_OVERFLOW, ON_OVERFLOW, pack_sft
from niels_gpt.packing.truncation import truncation_warning
from niels_gpt.seeds import seed_arg


def register(subparsers) -> None:
    p = subparsers.add_parser("pack-sft", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cache_dir", metavar="CACHE_DIR", help="SFT cache directory (with meta.json)")
    p.add_argument("out", metavar="OUT", help="output shard directory or fsspec URL")
    seq_len = p.add_argument("--seq-len", dest="pack_size", type=int, default=DEFAULT_PACK_SIZE,
                             help=f"tokens per bin, the training sequence length (default {DEFAULT_PACK_SIZE})")
    hidden_alias(p, "--pack-size", seq_len)
    p.add_argument("--algorithm", choices=ALGORITHMS, default=DEFAULT_ALGORITHM,
                   help=f"bin packing algorithm (default {DEFAULT_ALGORITHM})")
    p.add_argument("--split", choices=SPLITS, default="train", help="cache split to pack (default train)")
    p.add_argument("--on-overflow", choices=ON_OVERFLOW, default=DEFAULT_ON_OVERFLOW,
                   help="examples longer than --seq-len: truncate (keep the first seq-len tokens), reject (refuse the "
                        "run), or split (between whole turns, each piece keeping the system prompt; a turn longer "
                        f"than the room left is cut) (default {DEFAULT_ON_OVERFLOW})")
    p.add_argument("--no-val", dest="val", action="store_false",
                   help="with --split train: do not pack the cache's val split into OUT/val/ (default: packed "
                        "when the cache holds val examples)")
    p.add_argument("--seed", type=seed_arg, default=DEFAULT_SEED,
                   help=f"seed of first_fit_shuffle's torch generator (default {DEFAULT_SEED})")
    p.set_defaults(func=run_pack_sft)


def run_pack_sft(args) -> int:
    print(f"pack-sft: cache={args.cache_dir} split={args.split} out={args.out} seq_len={args.pack_size} "
          f"algorithm={args.algorithm} on_overflow={args.on_overflow} seed={args.seed}")
    m = pack_sft(args.cache_dir, args.out, pack_size=args.pack_size, algorithm=args.algorithm, split=args.split,
                 on_overflow=args.on_overflow, seed=args.seed, progress=True, warn=False, val=args.val)
    t = m["truncation"]
    lost = (f", {t['tokens_lost'] / t['tokens']:.1%} of the tokens and "
            f"{t['trained_targets_lost'] / max(t['trained_targets'], 1):.1%} of the trained targets cut"
            if t["tokens_lost"] else "")
    pieces = (f", {t['split_examples']} examples split into {t['split_pieces']} pieces of whole turns"
              if t.get("split_examples") else "")
    print(f"pack-sft: {m['num_bins']} bins, {m['num_sequences']} sequences, {m['num_tokens']} tokens, "
          f"efficiency {m['efficiency']:.4f}, truncated {m['truncated']}{lost}{pieces}")
    v = m.get("val")
    if v is not None:
        print(f"pack-sft: val: {v['num_bins']} bins, {v['num_sequences']} sequences, {v['num_tokens']} tokens, "
              f"efficiency {v['efficiency']:.4f}, truncated {v['truncated']} (in {args.out}/val)")
    message = truncation_warning(t, args.pack_size, f"{args.cache_dir} ({args.split})")
    if message is not None:
        print(f"pack-sft: warning: {message}", file=sys.stderr)
    return 0
