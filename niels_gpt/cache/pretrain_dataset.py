"""The pretraining cache reader: this contract path re-exports `niels_gpt.readers.pretrain`, where the code lives (docs/architecture.md)."""

from niels_gpt.readers.pretrain import *  # noqa: F403
from niels_gpt.readers.pretrain import PretrainTokenStreamDataset  # noqa: F401  (the contract's names)
