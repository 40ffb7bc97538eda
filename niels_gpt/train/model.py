"""The GPT that trains on our caches: nanochat's architecture, with document-aware attention.

RoPE, QK-norm, parameter-free RMSNorm (after the embedding and before the head), untied embedding and
lm_head, relu² MLP, no biases, grouped-query attention, logits soft-capped at 15.

Packed rows: give the forward `position_ids`, `cu_seqlens` (varlen offsets over the flattened B*T tokens)
or `doc_ids`; a token then attends only to earlier tokens of its own document and its RoPE position counts
from that document's start (attention.py chooses the kernel). Worked example (T=6, one row): cu_seqlens
[0, 2, 6] -> doc ids [0, 0, 1, 1, 1, 1], positions [0, 1, 0, 1, 2, 3]; token 3 attends to tokens 2 and 3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from niels_gpt.constants import IGNORE_INDEX
from niels_gpt.errors import ConfigError
from niels_gpt.train.attention import Attention

ASPECT_RATIO = 64  # nanochat: model width = depth * 64
HEAD_DIM = 128  # nanochat: heads of 128 dims
LOGIT_SOFTCAP = 15.0
ROPE_BASE = 10000.0


@dataclass(kw_only=True)
class GPTConfig:
    sequence_len: int = 1024
    vocab_size: int = 65536
    n_layer: int = 12
    n_head: int = 6
    n_kv_head: int = 6
    n_embd: int = 768

    def __post_init__(self):
        for name in ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"GPTConfig.{name}={getattr(self, name)}: must be >= 1")
        if self.n_embd % self.n_head:
            raise ConfigError(f"GPTConfig: n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        if (self.n_embd // self.n_head) % 2:
            raise ConfigError(f"GPTConfig: head dim {self.n_embd // self.n_head} must be even (RoPE rotates pairs)")
        if self.n_head % self.n_kv_head:
            raise ConfigError(f"GPTConfig: n_kv_head {self.n_kv_head} must divide n_head {self.n_head}")

    @classmethod
    def from_depth(cls, depth: int, *, vocab_size: int, sequence_len: int) -> GPTConfig:
        """nanochat's sizing: depth 20 -> 1280 wide, 10 heads (its d20); depth 2 -> 128 wide, 1 head."""
        if depth < 1:
            raise ConfigError(f"depth {depth}: must be >= 1")
        n_embd = depth * ASPECT_RATIO
        n_head = max(1, round(n_embd / HEAD_DIM))
        while n_embd % n_head or (n_embd // n_head) % 2:
            n_head -= 1  # the nearest head count that splits the width evenly
        return cls(sequence_len=sequence_len, vocab_size=vocab_size, n_layer=depth, n_head=n_head,
                   n_kv_head=n_head, n_embd=n_embd)


def norm(x: torch.Tensor) -> torch.Tensor:
    """RMSNorm with no learnable parameters."""
    return F.rms_norm(x, (x.size(-1),))


def apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, T, H, D) by angles given as cos/sin (B or 1, T, 1, D/2): pairs (i, i + D/2)."""
    d = x.shape[3] // 2
    x1, x2 = x[..., :d], x[..., d:]
    y1 = x1 * cos + x2 * sin
    y2 = x1 * (-sin) + x2 * cos
    return torch.cat([y1, y2], 3).to(x.dtype)


def document_layout(B: int, T: int, device, *, position_ids=None, cu_seqlens=None, doc_ids=None):
    """(positions (B, T), doc ids (B, T)) from a batch's document information; (None, None) without any."""
    if position_ids is None and cu_seqlens is None and doc_ids is None:
        return None, None
    ar = torch.arange(T, device=device).expand(B, T)
    if cu_seqlens is not None:
        cu = cu_seqlens.to(device=device, dtype=torch.int64)
        if cu.ndim != 1 or int(cu[0]) != 0 or int(cu[-1]) != B * T:
            raise ConfigError(f"cu_seqlens must be 1-D, start at 0 and end at B*T={B * T}; got "
                              f"{cu.tolist()[:4]}...{int(cu[-1])}: pass the collate's cu_seqlens for this batch")
        flat = torch.arange(B * T, device=device)
        seg = torch.searchsorted(cu[1:], flat, right=True)
        # segments restart at every row: cu_seqlens counts a row's tail padding as its own segment
        doc = seg.view(B, T)
        pos = (flat - cu[seg]).view(B, T) if position_ids is None else position_ids.to(device)
        return pos, doc
    if doc_ids is not None:
        doc = doc_ids.to(device)
        if position_ids is not None:
            return position_ids.to(device), doc
        start = torch.ones_like(doc, dtype=torch.bool)
        start[:, 1:] = doc[:, 1:] != doc[:, :-1]
        first = torch.where(start, ar, torch.zeros_like(ar)).cummax(dim=1).values
        return ar - first, doc
    pos = position_ids.to(device)
    return pos, (pos == 0).cumsum(dim=1)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.n_embd // config.n_head
        self.c_q = nn.Linear(config.n_embd, self.n_head * self.head_dim, bias=False)
        self.c_k = nn.Linear(config.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.c_v = nn.Linear(config.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x, cos, sin, attend: Attention):
        B, T, C = x.size()
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_kv_head, self.head_dim)
        q, k = apply_rotary_emb(q, cos, sin), apply_rotary_emb(k, cos, sin)
        q, k = norm(q), norm(k)
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attn = CausalSelfAttention(config)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, attend: Attention):
        x = x + self.attn(norm(x), cos, sin, attend)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    """`model(idx) -> logits (B, T, V)`; `model(idx, targets) -> mean loss over targets != -100`."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(config.vocab_size, config.n_embd),
            "h": nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
        })
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.attention = "auto"  # document-masked attention: auto, flex or mask (attention.py); not a weight
        # NOTE: 10x the training context, as nanochat: evaluation prompts may run longer; cheap.
        self.rotary_seq_len = config.sequence_len * 10
        cos, sin = self._rotary(self.rotary_seq_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _rotary(self, seq_len: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        head_dim = self.config.n_embd // self.config.n_head
        inv_freq = 1.0 / (ROPE_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
        freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv_freq)
        return freqs.cos(), freqs.sin()  # (seq_len, head_dim / 2)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """nanochat's init: embeddings N(0, 1), linears N(0, 1/sqrt(fan_in) * min(1, sqrt(fan_out/fan_in))),
        lm_head and every residual output projection zero."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                fan_out, fan_in = m.weight.shape
                std = 1.0 / math.sqrt(fan_in) * min(1.0, math.sqrt(fan_out / fan_in))
                nn.init.normal_(m.weight, mean=0.0, std=std, generator=generator)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=1.0, generator=generator)
        nn.init.zeros_(self.lm_head.weight)
        for block in self.transformer.h:
            nn.init.zeros_(block.mlp.c_proj.weight)
            nn.init.zeros_(block.attn.c_proj.weight)
        cos, sin = self._rotary(self.rotary_seq_len, device=self.lm_head.weight.device)
        self.cos.copy_(cos)
        self.sin.copy_(sin)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self) -> int:
        """6 * (non-embedding params) + 12 * layers * heads * head_dim * T (PaLM appendix B)."""
        c = self.config
        n = self.num_params() - self.transformer.wte.weight.numel()
        return 6 * n + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * c.sequence_len

    @torch.compiler.disable
    def _layout(self, B: int, T: int, device, position_ids, cu_seqlens, doc_ids):
        """(cos, sin, how to attend) for this batch. Left out of torch.compile: it checks values (a host
        sync) and builds a flex block mask, which compiles on its own."""
        pos, doc = document_layout(B, T, device, position_ids=position_ids, cu_seqlens=cu_seqlens,
                                   doc_ids=doc_ids)
        if pos is None:
            if T > self.rotary_seq_len:
                raise ConfigError(f"sequence of {T} tokens exceeds the rotary table ({self.rotary_seq_len})")
            return self.cos[None, :T, None, :], self.sin[None, :T, None, :], Attention(None)
        if int(pos.max()) >= self.rotary_seq_len:
            raise ConfigError(f"position {int(pos.max())} exceeds the rotary table ({self.rotary_seq_len})")
        return self.cos[pos][:, :, None, :], self.sin[pos][:, :, None, :], Attention(doc, self.attention)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, *, position_ids=None,
                cu_seqlens=None, doc_ids=None):
        B, T = idx.shape
        cos, sin, attend = self._layout(B, T, idx.device, position_ids, cu_seqlens, doc_ids)
        x = norm(self.transformer.wte(idx))
        for block in self.transformer.h:
            x = block(x, cos, sin, attend)
        logits = self.lm_head(norm(x)).float()
        logits = LOGIT_SOFTCAP * torch.tanh(logits / LOGIT_SOFTCAP)
        if targets is None:
            return logits
        flat = targets.reshape(-1)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), flat, ignore_index=IGNORE_INDEX, reduction="sum")
        # NOTE: a micro-batch whose targets are all ignored (SFT rows without an answer) adds 0, not NaN
        return loss / (flat != IGNORE_INDEX).sum().clamp(min=1)
