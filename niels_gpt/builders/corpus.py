"""`build_corpus`: the Python form of `build` for a user's corpus, returning the cache's meta.json.

    meta = build_corpus(["data/", "extra/*.jsonl.zst"], "cache/mine", tokenizer=tok, val_tokens=100_000)

Every argument is a `BuildSpec` field (builders/run.py) under the name it had before `build` had
executors: `max_tokens`, `val_tokens`, `val_frac`, `workers` (encode workers inline, or worker processes).
"""

from __future__ import annotations

from niels_gpt.builders.pretrain import SHARD_BYTES
from niels_gpt.builders.run import ALL_TOKENS, BuildSpec, build
from niels_gpt.constants import SEED
from niels_gpt.meta import read_meta
from niels_gpt.storage.upload import writes_to_url

TEXT_FIELD = "text"
MESSAGES_FIELD = "messages"


@writes_to_url  # out may be an fsspec URL: built locally (named after it), uploaded, meta.json last
def build_corpus(sources, out: str, *, tokenizer, chat: bool = False, text_field: str = TEXT_FIELD,
                 messages_field: str = MESSAGES_FIELD, chat_columns=None, max_tokens: int = ALL_TOKENS,
                 val_tokens: int | None = None, val_frac: float | None = None, shard_bytes: int = SHARD_BYTES,
                 seed: int = SEED, shuffle_buffer: int | None = None, workers: int | None = 1,
                 on_bad_record: str = "error", hf_config: str | None = None, split: str = "train",
                 name: str | None = None, progress: bool | None = False, layout: str | None = None,
                 executor: str = "inline", task_bytes: int | None = None, compress: str | None = None,
                 min_chars: int = 0, map: str | None = None, val_per_input: bool = False) -> dict:
    """Build a pretraining (or, with chat=True, SFT) cache at `out` from `sources`; returns its meta.json."""
    extra = {} if task_bytes is None else {"task_bytes": task_bytes}
    build(BuildSpec(sources=list(sources), out=str(out), tokenizer=tokenizer, chat=chat, layout=layout,
                    text_field=text_field, messages_field=messages_field,
                    chat_columns=tuple(chat_columns) if chat_columns else None, on_bad_record=on_bad_record,
                    hf_config=hf_config, split=split, max_tokens=max_tokens, val_tokens=val_tokens, val_frac=val_frac,
                    shard_bytes=shard_bytes, seed=seed, shuffle_buffer=shuffle_buffer, executor=executor,
                    workers=workers, name=name, progress=progress, compress=compress, min_chars=min_chars, map=map,
                    val_per_input=val_per_input, **extra), log=lambda msg: None)
    return read_meta(str(out))
