"""The tiny caches of tests/train (one of each kind the trainer reads), for the trace tests."""

from ..train.conftest import mixture_file, packed_dir, pretrain_cache, second_cache, sft_cache  # noqa: F401
