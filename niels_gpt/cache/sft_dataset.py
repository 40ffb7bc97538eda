"""The SFT cache reader: this contract path re-exports `niels_gpt.readers.sft`, where the code lives (docs/architecture.md)."""

from niels_gpt.readers.sft import *  # noqa: F403
from niels_gpt.readers.sft import SFTExampleDataset  # noqa: F401  (the contract's names)
