"""Causal self-attention for rows of one document or of several packed ones: one result, three kernels.

| path     | used when                                 | what it costs                                    |
|----------|-------------------------------------------|--------------------------------------------------|
| `causal` | the batch carries no document information | SDPA `is_causal`: flash / memory-efficient       |
| `flex`   | documents, on CUDA (the default there)    | compiled flex_attention: skips foreign blocks    |
| `mask`   | documents, on CPU (the default there)     | an explicit (B, 1, T, T) boolean mask via SDPA   |

flex_attention has no CPU backward, so CPU training keeps the mask; tests/train/test_attention.py holds
the two equal. Worked example (T=6): doc [0, 0, 1, 1, 1, 1] -> token 3 attends to tokens 2 and 3.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from niels_gpt.errors import ConfigError
from niels_gpt.train.config import CHOICES


def resolve(impl: str, device: torch.device) -> str:
    """The kernel for document-masked attention: `auto` is flex on CUDA, the explicit mask elsewhere."""
    if impl not in CHOICES["attention"]:
        raise ConfigError(f"attention {impl!r}: expected one of {', '.join(CHOICES['attention'])}")
    if impl == "auto":
        return "flex" if device.type == "cuda" else "mask"
    return impl


@functools.cache
def _compiled_flex():
    # NOTE: eager flex_attention materialises every score; compiled, it is one fused kernel that skips
    # the blocks the mask leaves empty. Inside a torch.compile'd model this call is traced into the graph.
    return torch.compile(flex_attention, dynamic=False)


class Attention:
    """How one forward pass attends: built once per batch, called by every layer with (B, H, T, D)."""

    def __init__(self, doc: torch.Tensor | None, impl: str = "auto"):
        self.doc = doc
        self.impl = "causal" if doc is None else resolve(impl, doc.device)
        self._mask = None
        if self.impl == "mask":
            B, T = doc.shape
            causal = torch.ones(T, T, dtype=torch.bool, device=doc.device).tril()
            self._mask = (causal & (doc[:, :, None] == doc[:, None, :]))[:, None]  # (B, 1, T, T)
        elif self.impl == "flex":
            B, T = doc.shape

            def same_document(b, h, q, kv):
                return (q >= kv) & (doc[b, q] == doc[b, kv])

            self._mask = create_block_mask(same_document, B, None, T, T, device=doc.device,
                                           _compile=doc.device.type == "cuda")

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        gqa = k.size(1) != q.size(1)
        if self.impl == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        if self.impl == "mask":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self._mask, enable_gqa=gqa)
        # flex takes one dtype; under autocast the normed q, k can come out in fp32 beside a bf16 v
        q, k = q.to(v.dtype), k.to(v.dtype)
        if q.is_cuda:
            # inside a compiled model the call is traced into its graph; an eager model calls the compiled kernel
            fn = flex_attention if torch.compiler.is_compiling() else _compiled_flex()
            return fn(q, k, v, block_mask=self._mask, enable_gqa=gqa)

        if torch.is_grad_enabled() and q.requires_grad:
            raise ConfigError("attention 'flex' on CPU runs forward only (torch has no CPU backward for it): "
                              "train on CPU with --attention mask (or auto)")
        with warnings.catch_warnings():
            # NOTE: the eager path is what the CPU equality tests compare; torch warns it is unfused
            warnings.simplefilter("ignore", UserWarning)
            return flex_attention(q, k, v, block_mask=self._mask, enable_gqa=gqa)
