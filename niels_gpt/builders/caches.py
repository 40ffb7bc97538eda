"""The contract's two cache builders and their defaults, in one import (niels_gpt.cache.build_cache re-exports
this module): the code lives in builders/pretrain.py, builders/sft.py and builders/encoding.py."""

from niels_gpt.builders.common import all_skipped  # noqa: F401
from niels_gpt.builders.encoding import ENCODE_BATCH_DOCS, shuffled  # noqa: F401
from niels_gpt.builders.pretrain import (  # noqa: F401
    MAX_TRAIN_TOKENS,
    MAX_VAL_TOKENS,
    SHARD_BYTES,
    SHUFFLE_BUFFER,
    SPLIT_RULE,
    SPLIT_RULE_BOS,
    SplitTexts,
    build_pretrain_cache,
    pretrain_meta,
)
from niels_gpt.builders.sft import (  # noqa: F401
    CHAT_TEMPLATE_RENDERING,
    SFT_DRAW_BLOCK,
    VAL_FRAC,
    build_sft_cache,
    sft_split_rule,
)
from niels_gpt.constants import SEED  # noqa: F401  (re-exported under its old name)
from niels_gpt.sources.documents import Skipped  # noqa: F401
from niels_gpt.tokenizer.base import Message  # noqa: F401  (the contract's Message type lives here too)
