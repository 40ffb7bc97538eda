"""Names and numbers every layer shares, defined once (the bottom layer: imports nothing of the package)."""

from __future__ import annotations

import numpy as np

SPLITS = ("train", "val")  # a cache's splits, in the order they are built and listed
SEED = 42  # the default seed of the builders, the tokenizer trainer and the sources' shuffles
IGNORE_INDEX = -100  # a label that no loss counts (torch's cross_entropy default)
META_NAME = "meta.json"  # our caches' and tokenizer's commit marker
MANIFEST_NAME = "manifest.json"  # packed bins' commit marker
EXAMPLES_NAME = "examples.npy"  # beside packed bins: the cache example of each packed sequence (pack-sft)
MODEL_NAME = "spm.model"  # a sentencepiece tokenizer's model file in its directory
RECEIPT_NAME = "niels_receipt.json"  # convert's commit marker for the peers' formats (formats/receipt.py)
MARKERS = (META_NAME, MANIFEST_NAME, RECEIPT_NAME)  # every commit marker: written last, read first
PARQUET_SUFFIXES = (".parquet", ".pq")  # what a Parquet file's name ends with
SHARD_BYTES = 128 * 1024 * 1024  # the shard size target of build, build-all and convert

# Our caches' token dtypes, by the name meta.json records; the peers' formats name them without "-le".
TOKEN_DTYPES: dict[str, np.dtype] = {"uint16-le": np.dtype("<u2"), "uint32-le": np.dtype("<u4")}
PEER_TOKEN_DTYPES: dict[str, np.dtype] = {k.removesuffix("-le"): v for k, v in TOKEN_DTYPES.items()}
UINT16_LIMIT = 65536  # ids a uint16 token file holds


def token_dtype_for(vocab_size: int) -> np.dtype:
    """The token dtype of a vocabulary: little-endian uint16 when every id fits, else uint32."""
    return TOKEN_DTYPES["uint16-le"] if vocab_size <= UINT16_LIMIT else TOKEN_DTYPES["uint32-le"]
