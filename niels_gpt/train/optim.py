"""Optimizers and schedules, as nanochat sets them up.

- Muon for the block matrices: Nesterov momentum, then 5 Newton-Schulz steps to the nearest
  semi-orthogonal matrix, scaled by sqrt(max(1, rows/cols)); every DDP rank repeats the same update;
- AdamW (betas 0.8/0.95, eps 1e-10) for embedding and lm_head, learning rates scaled by (n_embd/768)**-0.5;
  `optimizer="adamw"`: AdamW for everything;
- LR: linear warmup, constant, linear warmdown to `final_lr_frac`; Muon momentum 0.85 -> 0.95 over 300 steps.
"""

from __future__ import annotations

import torch

from niels_gpt.errors import ConfigError
from niels_gpt.train.config import CHOICES

NS_COEFFS = (3.4445, -4.7750, 2.0315)
ADAM_BETAS = (0.8, 0.95)
ADAM_EPS = 1e-10


def zeropower_via_newtonschulz5(G: torch.Tensor) -> torch.Tensor:
    """Approximately U V^T of G = U S V^T (Keller Jordan's quintic iteration)."""
    a, b, c = NS_COEFFS
    X = G.bfloat16() if G.is_cuda else G.float()
    tall = G.size(-2) > G.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(5):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if tall:
        X = X.mT
    return X.to(G.dtype)


class Muon(torch.optim.Optimizer):
    """MomentUm Orthogonalized by Newton-schulz, for 2-D parameters (Nesterov momentum)."""

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95):
        super().__init__(params, dict(lr=lr, momentum=momentum))
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ConfigError(f"Muon takes matrices; got a parameter of shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(g)
                buf = state["momentum_buffer"]
                buf.lerp_(g, 1 - group["momentum"])
                g = zeropower_via_newtonschulz5(g.lerp(buf, group["momentum"]))
                p.add_(g, alpha=-group["lr"] * max(1.0, p.size(-2) / p.size(-1)) ** 0.5)


def build_optimizers(model, cfg) -> list[torch.optim.Optimizer]:
    """[AdamW, Muon] (or [AdamW]) at `cfg`'s rates; each group remembers its `initial_lr` for the schedule."""
    if cfg.optimizer not in CHOICES["optimizer"]:
        raise ConfigError(f"optimizer {cfg.optimizer!r}: expected 'muon' or 'adamw'")
    scale = (model.config.n_embd / 768) ** -0.5
    matrices = list(model.transformer.h.parameters())
    groups = [dict(params=list(model.lm_head.parameters()), lr=cfg.unembedding_lr * scale),
              dict(params=list(model.transformer.wte.parameters()), lr=cfg.embedding_lr * scale)]
    if cfg.optimizer == "adamw":
        groups.append(dict(params=matrices, lr=cfg.adamw_matrix_lr))
    # NOTE: the foreach/fused kernels change summation order between devices; the plain loop keeps
    # CPU runs bit-for-bit reproducible, and costs nothing at the embedding's size.
    use_fused = next(model.parameters()).is_cuda
    opts: list[torch.optim.Optimizer] = [torch.optim.AdamW(groups, betas=ADAM_BETAS, eps=ADAM_EPS,
                                                           weight_decay=cfg.weight_decay, fused=use_fused or None,
                                                           foreach=False if not use_fused else None)]
    if cfg.optimizer == "muon":
        opts.append(Muon(matrices, lr=cfg.matrix_lr))
    for opt in opts:
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
    return opts


def lr_multiplier(step: int, num_steps: int, *, warmup_ratio: float = 0.0, warmdown_ratio: float = 0.2,
                  final_lr_frac: float = 0.0) -> float:
    """Worked example (100 steps, warmdown 0.2): steps 0..80 -> 1.0, step 90 -> 0.5, step 99 -> 0.05."""
    warmup = round(warmup_ratio * num_steps)
    warmdown = round(warmdown_ratio * num_steps)
    if step < warmup:
        return (step + 1) / warmup
    if step <= num_steps - warmdown:
        return 1.0
    progress = (num_steps - step) / warmdown
    return progress + (1 - progress) * final_lr_frac


def muon_momentum(step: int) -> float:
    frac = min(step / 300, 1.0)
    return (1 - frac) * 0.85 + frac * 0.95
