"""The pretraining and SFT cache builders: this contract path re-exports `niels_gpt.builders.caches`, where the code lives (docs/architecture.md)."""

from niels_gpt.builders.caches import *  # noqa: F403
from niels_gpt.builders.caches import build_pretrain_cache, build_sft_cache  # noqa: F401  (the contract's names)
