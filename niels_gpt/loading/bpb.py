"""Bits per byte: a loss that does not depend on the tokenizer's vocabulary.

bpb = (sum of cross-entropy in nats over counted targets) / (ln 2 * sum of their UTF-8 bytes); a target
counts when it is not ignored (negative) and stands for at least one byte (special tokens have 0), as in
nanochat's evaluate_bpb. Both sums are all-reduced across ranks under torch.distributed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from niels_gpt.errors import ConfigError


def token_bytes(tokenizer, device: str | torch.device = "cpu") -> torch.Tensor:
    """int64[len(tokenizer)]: UTF-8 bytes per id, 0 for special tokens."""
    return torch.as_tensor(tokenizer.token_byte_lengths(), dtype=torch.int64, device=device)


def batch_inputs_targets(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of a batch: a dict's `input_ids` and `labels`, else its first and last tensors (so
    SFT rows `(x, y, y_masked)` score the assistant targets only)."""
    if isinstance(batch, dict):
        if "input_ids" not in batch or "labels" not in batch:
            raise ConfigError(f"batch has keys {sorted(batch)}: expected 'input_ids' and 'labels'")
        return batch["input_ids"], batch["labels"]
    tensors = [t for t in batch if isinstance(t, torch.Tensor)]
    if len(tensors) < 2:
        raise ConfigError(f"batch of {len(batch)} items holds {len(tensors)} tensor(s): expected at least two "
                          "tensors (inputs first, targets last)")
    return tensors[0], tensors[-1]


@torch.no_grad()
def evaluate_bpb(model: Callable[[torch.Tensor], torch.Tensor], batches: Iterable, token_bytes: torch.Tensor,
                 *, steps: int | None = None) -> float:
    """Bits per byte of `model` (x -> logits (B, T, V)) over `batches` (at most `steps` of them); targets
    use -100 to ignore."""
    device = token_bytes.device
    total_nats = torch.zeros((), dtype=torch.float64, device=device)
    total_bytes = torch.zeros((), dtype=torch.int64, device=device)
    for i, batch in enumerate(batches):
        if steps is not None and i >= steps:
            break
        x, y = batch_inputs_targets(batch)
        logits = model(x.to(device))
        y = y.to(device).reshape(-1)
        if logits.shape[:-1].numel() != y.numel():
            raise ConfigError(f"model returned logits of shape {tuple(logits.shape)} for targets of shape "
                              f"{tuple(y.shape)}: expected (B, T, vocab)")
        if int(y.max()) >= len(token_bytes):
            raise ConfigError(f"target id {int(y.max())} >= vocabulary {len(token_bytes)} of token_bytes: "
                              "pass token_bytes(tokenizer) of the tokenizer that made the data")
        valid = y >= 0
        safe = torch.where(valid, y, torch.zeros_like(y))
        nbytes = torch.where(valid, token_bytes[safe], torch.zeros_like(safe))
        loss = F.cross_entropy(logits.reshape(y.numel(), -1).float(), safe, reduction="none")
        total_nats += torch.where(nbytes > 0, loss.double(), 0.0).sum()  # not loss * mask: inf * 0 is NaN
        total_bytes += nbytes.sum()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total_nats, op=dist.ReduceOp.SUM)
        dist.all_reduce(total_bytes, op=dist.ReduceOp.SUM)
    if int(total_bytes) == 0:
        raise ConfigError("no target byte to score: every target was ignored or a special token")
    return float(total_nats) / (math.log(2) * int(total_bytes))
