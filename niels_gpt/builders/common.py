"""What the pretraining and SFT builders share: the fields every meta.json has, skip counts, the dtype, and
how a build starts in its staging directory."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from pathlib import Path

import numpy as np

from niels_gpt.atomic import remove_stale_temporaries
from niels_gpt.meta import FORMAT_VERSION, META_NAME, meta_token_dtype, numpy_dtype, read_meta


def resolve_dtype(tokenizer, token_dtype: str | None) -> np.dtype:
    if token_dtype is None:
        return np.dtype(tokenizer.token_dtype)
    return numpy_dtype(token_dtype)


def start_build(out: Path, split_dirs: list[str]) -> None:
    """Uncommit any previous cache here (meta first), clear its token files and the temporaries of killed
    builds (`*.tmp-<pid>` of a process that no longer runs)."""
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(out / META_NAME)
    for sub in split_dirs:
        d = out / sub
        d.mkdir(exist_ok=True)
        for old in d.glob("shard_*.bin"):
            old.unlink()


def all_skipped(own: Counter, source: dict | None) -> dict:
    """Records skipped by the builder and by the source (what it dropped while reading), by reason."""
    out = dict(own)
    for reason, n in ((source or {}).get("skipped") or {}).items():
        out[reason] = out.get(reason, 0) + int(n)
    return dict(sorted(out.items()))


def common_meta(tokenizer, dtype, seed, name, config, streaming, source, tokenizer_path: str | None = None) -> dict:
    """The fields every cache's meta.json has. `tokenizer_path`: where train, stats and inspect find the tokenizer
    again (tokenizer/find.py); `build` gives it when a `tokenizer/` directory above the cache would not."""
    described = tokenizer.describe()
    if tokenizer_path is not None:
        described["path"] = tokenizer_path
    left_out = {}
    if isinstance(source, dict) and source.get("skipped_inputs"):  # files under a source that were not read
        left_out = {"skipped_inputs": source["skipped_inputs"]}
        source = {k: v for k, v in source.items() if k != "skipped_inputs"}
    return {
        "format_version": FORMAT_VERSION,
        "built": True,
        "dataset_name": name,
        "dataset_config": config,
        "seed": seed,
        "token_dtype": meta_token_dtype(dtype),
        "tokenizer_sha256": tokenizer.sha256,
        "tokenizer": described,
        "vocab_size": len(tokenizer),
        "special_token_ids": dict(tokenizer.special_ids),
        "streaming": streaming,
        "source": source,
        "randomness": "torch.Generator only",
        **left_out,
    }


def summarize(out: Path, **facts) -> dict:
    meta = read_meta(str(out))
    totals = meta["totals"]
    tokens = totals["train_tokens"] + totals["val_tokens"]
    return {"kind": meta["kind"], "totals": totals, "tokens": tokens, "files": len(meta["files"]),
            "skipped": {k: v for k, v in (meta.get("skipped") or {}).items() if v},
            "skipped_inputs": meta.get("skipped_inputs") or [], **facts}


# What to do when every conversation was skipped, by the reason most of them were: the advice of a chat build
# that ends with no example (builders/sft.py::sft_meta).
NO_CONVERSATION_ADVICE = {
    "bad_messages": "the records are not lists of {\"role\", \"content\"} messages: name their layout with --format "
                    "(sharegpt for {\"from\", \"value\"} turns, alpaca for instruction/input/output rows, dolly, "
                    "oasst), or convert them to {\"role\", \"content\"} messages",
    "missing_field": "the records lack the conversation's field: point --messages-field (or --chat-columns "
                     "USER_COL,ASSISTANT_COL) at it, or name the records' layout with --format",
    "not_text": "the chosen fields are not text: point --chat-columns or --messages-field at text fields",
    "no_assistant_turn": "each conversation needs an assistant turn to train on: check that the assistant's "
                         "role or field is the one the layout reads",
    "non_text_part": "the messages hold images, audio or files (content parts other than text): remove those parts "
                     "from the records",
    "tool_turn": "the conversations hold tool calls or results, which the library's chat format cannot show: use a "
                 "tokenizer whose chat template renders tools (tokenizer_config.json, or --chat-template FILE)",
}


def no_conversation_message(final, skipped: dict, source: dict | None = None) -> str:
    """One line for an SFT build in which no conversation was usable: its inputs, what was skipped, what to do."""
    counted = ", ".join(f"{reason} {n:,}" for reason, n in sorted(skipped.items(), key=lambda kv: -kv[1])) or "none"
    top = max(skipped, key=skipped.get) if skipped else None
    advice = NO_CONVERSATION_ADVICE.get(top, "fix the records (meta.json's skipped counts name each reason), or "
                                              "name their layout with --format")
    files = (source or {}).get("files") or []
    read = f" from {', '.join(map(str, files[:3]))}{' and more' if len(files) > 3 else ''}" if files else ""
    return f"no usable conversation for {final}{read}: every record was skipped (by reason: {counted}); {advice}"
