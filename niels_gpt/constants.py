"""Names and numbers every layer shares, defined once (the bottom layer: imports nothing of the package).

Modules that used to define these re-export them under their old names, so old imports keep working.
"""

from __future__ import annotations

import numpy as np

SPLITS = ("train", "val")  # a cache's splits, in the order they are built and listed
SEED = 42  # the default seed of the builders, the tokenizer trainer and the sources' shuffles
IGNORE_INDEX = -100  # a label that no loss counts (torch's cross_entropy default)
META_NAME = "meta.json"  # our caches' and tokenizer's commit marker
MANIFEST_NAME = "manifest.json"  # packed bins' commit marker

# Our caches' token dtypes, by the name meta.json records; the peers' formats name them without "-le".
TOKEN_DTYPES: dict[str, np.dtype] = {"uint16-le": np.dtype("<u2"), "uint32-le": np.dtype("<u4")}
PEER_TOKEN_DTYPES: dict[str, np.dtype] = {k.removesuffix("-le"): v for k, v in TOKEN_DTYPES.items()}
