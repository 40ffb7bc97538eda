"""Format detection for every token layout the library reads: this contract path re-exports `niels_gpt.formats.detect`, where the code lives (docs/architecture.md)."""

from niels_gpt.formats.detect import *  # noqa: F403
from niels_gpt.formats.detect import FormatInfo, detect_format  # noqa: F401  (the contract's names)
