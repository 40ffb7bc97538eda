"""inspect and verify: look at every output of the library through the same readers training uses.

`found` lists the outputs at or below a path (caches, unfinished and interrupted builds, the tokenizer a
cache names; what one path holds is niels_gpt.locate's to say); `verify` checks each output against its own record and its readers;
`inspection` describes an output and decodes a window of it.
"""

from niels_gpt.report.found import (
    find_caches,
    find_tokenizer,
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

__all__ = ["TRAINED_CLOSE", "TRAINED_OPEN", "find_caches", "find_tokenizer", "inspect_json", "inspect_path",
           "show_tokens", "totals_table",
           "unfinished_dirs", "verify_outputs", "verify_path"]
