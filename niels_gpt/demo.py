"""`make demo`: the whole pipeline on the bundled sample corpus, offline.

1. every source of the sample corpus: documents or conversations, characters, skipped records;
2. build-all --sample: the tokenizer (16,000 pieces + 4 specials) and every cache;
3. one rendered conversation with its assistant mask made visible;
4. inspect one pretraining cache and one SFT cache, and draw a batch from each;
5. training: a base model on the wikitext cache (stopped, resumed, val bpb, CORE), SFT from its weights
   on packed dolly15k bins, and a sample of its answer.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from niels_gpt.builders.plan import make_plan
from niels_gpt.cli import main as cli
from niels_gpt.constants import IGNORE_INDEX
from niels_gpt.readers.pretrain import PretrainTokenStreamDataset
from niels_gpt.readers.sft import SFTExampleDataset
from niels_gpt.report import show_tokens
from niels_gpt.seeds import seed_arg
from niels_gpt.sources.documents import Skipped
from niels_gpt.sources.named import NAMED, inputs
from niels_gpt.sources.stream import task_items
from niels_gpt.tokenizer import load_tokenizer
from niels_gpt.train.demo_run import demo_training


def source_table(seed: int) -> str:
    lines = [f"{'source':<12} {'kind':<5} {'split':<6} {'records':>8} {'characters':>11}  skipped"]
    for name in NAMED:
        fields = inputs(name, {}, seed, sample=True)
        chat = fields.get("chat", False)
        splits = [("train", fields["sources"], fields.get("split", "train"))]
        if fields.get("val_sources") is not None:
            splits.append(("val", fields["val_sources"], fields.get("val_split") or fields.get("split", "train")))
        for split, srcs, hub_split in splits:
            plan = make_plan(srcs, tokenizer=None, chat=chat, layout=fields["layout"], config=fields.get("hf_config"),
                             split=hub_split)
            items = [item for t in plan.tasks for item in task_items(t, plan.rules, plan.signatures)]
            kept = [item for item in items if isinstance(item, (str, list))]
            skipped = dict(Counter(item.reason for item in items if isinstance(item, Skipped)))
            chars = sum(len(m["content"]) for c in kept for m in c) if chat else sum(map(len, kept))
            label = "all" if chat else split if len(splits) > 1 else "stream"
            lines.append(f"{name:<12} {'chat' if chat else 'text':<5} {label:<6} {len(kept):>8} {chars:>11,}  "
                         f"{skipped or '-'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache-dir", default="cache-demo")
    p.add_argument("--seed", type=seed_arg, default=42)
    args = p.parse_args(argv)
    root = Path(args.cache_dir)

    print("== 1. the bundled sample corpus, source by source\n")
    print(source_table(args.seed))

    print("\n== 2. build-all on the sample corpus\n")
    rc = cli(["build-all", "--cache-dir", str(root), "--seed", str(args.seed), "--sample", "--no-progress"])
    if rc:
        return rc

    tok = load_tokenizer(root / "tokenizer")
    plan = make_plan(inputs("dolly15k", {}, args.seed, sample=True)["sources"], tokenizer=None, chat=True, layout="dolly")
    conv = next(item for item in task_items(plan.tasks[0], plan.rules) if isinstance(item, list))
    ids, mask = tok.render_chat(conv)
    print(f"\n== 3. a rendered dolly15k conversation: {len(ids)} ids, {sum(mask)} trained (inside ⟦ ⟧)\n")
    print(show_tokens(tok, ids, mask))

    print("\n== 4. inspect, then a batch from each cache\n")
    for cache in ("pretrain/wikitext", "sft/oasst1"):
        if cli(["inspect", str(root / cache), "--window", "48"]):
            return 1
        print()
    g = torch.Generator().manual_seed(args.seed)
    ds = PretrainTokenStreamDataset(str(root / "pretrain/fineweb_edu/train"), T=256, device="cpu")
    x, y = ds.get_batch(B=8, generator=g)
    print(f"pretrain batch: x {tuple(x.shape)} {x.dtype}, y[:, :-1] == x[:, 1:]: {bool((y[:, :-1] == x[:, 1:]).all())}")
    print(f"  row 0: {tok.decode(x[0, :40].tolist())!r}…")
    sft = SFTExampleDataset(str(root / "sft/dolly15k/train_tokens.bin"), str(root / "sft/dolly15k/train_idx.npy"),
                            T=256, device="cpu", eot_id=tok.eot_id)
    x, y, y_masked = sft.get_batch(B=4, generator=g)
    trained = y_masked != IGNORE_INDEX
    print(f"sft batch: x {tuple(x.shape)}; trained targets per row {trained.sum(1).tolist()} of {x.shape[1]}")
    row = np.flatnonzero(trained[0].numpy())
    print(f"  row 0 trained targets decode to: {tok.decode(y[0, row].tolist())[:200]!r}")
    print("\n== 5. training (niels_gpt.train): base, interrupted and resumed, then SFT, then a sample\n")
    demo_training(root, args.seed)
    print(f"\ncaches are in {root}/ ; verify them with: python -m niels_gpt.cli verify {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
