"""The meta.json record (schema, file records, checksums): this contract path re-exports `niels_gpt.meta`, where the code lives (docs/architecture.md)."""

from niels_gpt.meta import *  # noqa: F403
from niels_gpt.meta import read_meta, sha256_file, write_meta  # noqa: F401  (the contract's names)
