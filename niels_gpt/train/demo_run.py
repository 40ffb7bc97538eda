"""The training part of `make demo`: a small GPT on the demo's wikitext cache, interrupted and resumed.

About a minute on 2 CPU cores (49 s on an idle 2-core VM): 80 steps of 8 x 128 tokens, checkpointed
at step 40 in runs/demo next to the cache directory (the caches stay as the build made them), resumed
from that checkpoint in a second call, val bits per byte at steps 40 and 80, CORE on the bundled items.
"""

from __future__ import annotations

from pathlib import Path

from niels_gpt.train.train import TrainConfig, train

STEPS = 80


def demo_training(root: Path, seed: int, *, steps: int = STEPS) -> dict:
    cfg = dict(data=str(root / "pretrain" / "wikitext"), out_dir=str(root.resolve().parent / "runs" / "demo"), depth=2,
               sequence_len=128, device_batch_size=8, steps=steps, eval_steps=8, seed=seed, log_every=5)
    for old in Path(cfg["out_dir"]).glob("ckpt_*.pt"):
        old.unlink()  # a fresh run every time the demo runs
    first = train(TrainConfig(**cfg, stop_at=steps // 2))
    print(f"-- interrupted after step {first.step}; resuming from {first.checkpoint}")
    second = train(TrainConfig(**cfg, resume="latest", core="bundled"))
    losses = first.losses + second.losses
    curve = " ".join(f"{losses[i]:.2f}" for i in range(0, len(losses), 10))
    print(f"loss curve, every 10th step from step 1: {curve} ... {losses[-1]:.2f}")
    print(f"loss: {losses[0]:.3f} at step 1 -> {losses[-1]:.3f} at step {len(losses)}; "
          f"val bpb {first.val_bpb[-1][1]:.3f} at step {first.step} -> {second.val_bpb[-1][1]:.3f} at step {second.step}")
    return {"losses": losses, "val_bpb": first.val_bpb + second.val_bpb, "core": second.core}
