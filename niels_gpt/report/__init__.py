"""inspect and verify: look at every output of the library through the same readers training uses.

`found` says what a path holds (caches, packed directories, converted outputs, unfinished builds, the
tokenizer a cache names); `verify` checks each output against its own record and its readers;
`inspection` describes an output and decodes a window of it.
"""

from niels_gpt.report.found import (
    PACKED_MANIFEST,
    find_caches,
    find_tokenizer,
    foreign_output,
    is_packed_parquet,
    megatron_prefix,
    unfinished_dirs,
)
from niels_gpt.report.inspection import (
    TRAINED_CLOSE,
    TRAINED_OPEN,
    inspect_json,
    inspect_path,
    show_tokens,
    totals_table,
)
from niels_gpt.report.verify import verify_outputs, verify_path

__all__ = ["PACKED_MANIFEST", "TRAINED_CLOSE", "TRAINED_OPEN", "find_caches", "find_tokenizer", "foreign_output",
           "inspect_json", "inspect_path", "is_packed_parquet", "megatron_prefix", "show_tokens", "totals_table",
           "unfinished_dirs", "verify_outputs", "verify_path"]
