"""The contract's cache builders and its Message type: the code lives in builders/pretrain.py, builders/sft.py
and tokenizer/base.py (docs/architecture.md)."""

from niels_gpt.builders.pretrain import build_pretrain_cache  # noqa: F401  (the contract's names)
from niels_gpt.builders.sft import build_sft_cache  # noqa: F401
from niels_gpt.tokenizer.base import Message  # noqa: F401
