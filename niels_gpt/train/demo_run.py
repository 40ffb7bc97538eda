"""The training part of `make demo`: base -> SFT -> a sample, in nanochat's order.

Base: a 2-layer GPT on the demo's wikitext cache, stopped at half its steps and resumed, with val bpb and
CORE; SFT: the dolly15k cache packed into bins of 256 tokens, trained --init-from the base; then a greedy
sample. About 20 s on 2 CPU cores; each run replaces the previous demo's runs.
"""

from __future__ import annotations

from pathlib import Path

from niels_gpt.packing import pack_sft
from niels_gpt.train.sample import sample
from niels_gpt.train.train import TrainConfig, train

STEPS = 80
SFT_STEPS = 20
SFT_T = 256
PROMPT = "What is a cache?"


def demo_training(root: Path, seed: int, *, steps: int = STEPS, sft_steps: int = SFT_STEPS) -> dict:
    runs = root.resolve().parent / "runs"
    cfg = dict(data=str(root / "pretrain" / "wikitext"), out_dir=str(runs / "demo"), depth=2,
               sequence_len=128, device_batch_size=8, steps=steps, eval_steps=8, seed=seed, log_every=5)
    first = train(TrainConfig(**cfg, stop_at=steps // 2, overwrite=True))
    print(f"-- interrupted after step {first.step}; resuming from {first.checkpoint}")
    second = train(TrainConfig(**cfg, resume="latest", core="bundled"))
    losses = first.losses + second.losses
    curve = " ".join(f"{losses[i]:.2f}" for i in range(0, len(losses), 10))
    print(f"loss curve, every 10th step from step 1: {curve} ... {losses[-1]:.2f}")
    print(f"loss: {losses[0]:.3f} at step 1 -> {losses[-1]:.3f} at step {len(losses)}; "
          f"val bpb {first.val_bpb[-1][1]:.3f} at step {first.step} -> {second.val_bpb[-1][1]:.3f} at step {second.step}")

    packed = root / "packed" / "dolly15k"
    print(f"\n-- SFT: pack-sft {root / 'sft' / 'dolly15k'} {packed} --seq-len {SFT_T}, then train --init-from "
          f"{second.checkpoint}")
    pack_sft(root / "sft" / "dolly15k", packed, pack_size=SFT_T, on_overflow="truncate")
    sft = train(TrainConfig(data=str(packed), out_dir=str(runs / "demo-sft"), init_from=second.checkpoint,
                            sequence_len=SFT_T, device_batch_size=4, steps=sft_steps, seed=seed, log_every=5,
                            overwrite=True))
    print(f"SFT loss: {sft.losses[0]:.3f} at step 1 -> {sft.losses[-1]:.3f} at step {sft.step}")
    answer = sample(sft.checkpoint, PROMPT, chat=True, max_tokens=40, temperature=0.0, device="cpu")
    print(f"\n-- sample {sft.checkpoint} --prompt {PROMPT!r} --chat --temperature 0\n{PROMPT} -> {answer}")
    return {"losses": losses, "val_bpb": first.val_bpb + second.val_bpb, "core": second.core,
            "sft_losses": sft.losses, "sample": answer}
