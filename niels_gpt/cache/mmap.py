"""Memory-mapped token files: this contract path re-exports `niels_gpt.readers.mmap`, where the code lives (docs/architecture.md)."""

from niels_gpt.meta import numpy_dtype  # noqa: F401  (the contract's names)
from niels_gpt.readers.mmap import *  # noqa: F403
from niels_gpt.readers.mmap import open_tokens  # noqa: F401  (the contract's names)
