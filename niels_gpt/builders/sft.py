"""The SFT builder (`build_sft_cache`): conversations rendered into a token stream with start offsets.

Each conversation is rendered (sentinel, content, EOT per message), sent to val with probability `val_frac`
(one torch draw per usable example) and appended to `{split}_tokens.bin`, its start offset to
`{split}_idx.npy` (int64). A tokenizer's own chat template leaves no sentinels to find the assistant spans
by, so its mask is stored: `{split}_mask.bin`, one uint8 per token. `SFTWriter` draws and writes for this
builder and for the parallel commit (builders/commit.py) alike, so both write the same bytes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from niels_gpt import allocator
from niels_gpt.atomic import atomic_path
from niels_gpt.builders.common import all_skipped, common_meta, resolve_dtype, start_build
from niels_gpt.builders.encoding import _encode_threads
from niels_gpt.builders.rendering import renderings
from niels_gpt.errors import ConfigError
from niels_gpt.formats.writers import HashingFile, check_range
from niels_gpt.meta import file_record, write_meta
from niels_gpt.progress import progress_bar
from niels_gpt.seeds import TorchDraws, check_seed
from niels_gpt.sources.documents import Skipped
from niels_gpt.sources.origins import OriginLog, origins_meta
from niels_gpt.staging import build_aside
from niels_gpt.storage.upload import writes_to_url
from niels_gpt.tokenizer.base import Message
from niels_gpt.tokenizer.fast import encoder_record

SFT_DRAW_BLOCK = 1024
VAL_FRAC = 0.10
CHAT_TEMPLATE_RENDERING = ("the tokenizer's chat template (niels_gpt.tokenizer.chat); trained tokens = the text each "
                           "assistant message adds (content + the template's end of turn), stored in {split}_mask.bin")


# What to do when every conversation was skipped, by the reason most of them were: the advice of a chat build
# that ends with no example.
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


def sft_split_rule(seed: int, val_frac: float) -> str:
    """The SFT split in words precise enough to recompute it (tests/test_build_cache.py does)."""
    return (f"by example: g = torch.Generator().manual_seed({seed}); draws = the concatenation of "
            f"torch.rand({SFT_DRAW_BLOCK}, generator=g, dtype=torch.float64) calls, taken in order; the k-th "
            f"usable example of the stream (0-based, in stream order; skipped examples take no draw) goes to "
            f"val when draws[k] < {val_frac!r}, else to train")


class SFTWriter:
    """Draws each usable example's split and appends it: tokens, mask (a chat template's), offset."""

    def __init__(self, out: Path, dtype: np.dtype, *, stored_mask: bool, val_frac: float, seed: int,
                 origins: bool = False):
        self.out, self.dtype, self.stored_mask, self.val_frac = out, dtype, stored_mask, val_frac
        self.log = OriginLog(None) if origins else None  # each example's origin (builders/origins.py)
        self.gen = TorchDraws(seed)  # torch's draws, without importing torch (seeds.py)
        self.draws: list[float] = []
        self.files = {s: HashingFile(out / f"{s}_tokens.bin") for s in ("train", "val")}
        if stored_mask:
            self.files.update({f"{s}_mask": HashingFile(out / f"{s}_mask.bin") for s in ("train", "val")})
        self.trained = {"train": 0, "val": 0}
        self.offsets: dict[str, list[int]] = {"train": [], "val": []}
        self.tokens = {"train": 0, "val": 0}

    def add(self, ids: np.ndarray, mask: np.ndarray | None, origin=None) -> None:
        if not self.draws:
            self.draws = self.gen.uniform(SFT_DRAW_BLOCK)[::-1]
        split = "val" if self.draws.pop() < self.val_frac else "train"
        self.offsets[split].append(self.tokens[split])
        if self.log is not None:
            self.log.add(split, origin)
        self.files[split].write(ids.astype(self.dtype, copy=False))
        if self.stored_mask:
            self.files[f"{split}_mask"].write(mask.astype(np.uint8, copy=False))
            self.trained[split] += int(mask.sum())
        self.tokens[split] += len(ids)

    def close(self) -> dict:
        records = {}
        for s in ("train", "val"):
            records[f"{s}_tokens.bin"] = {**self.files[s].close(), "tokens": self.tokens[s]}
            if self.stored_mask:
                records[f"{s}_mask.bin"] = {**self.files[f"{s}_mask"].close(), "trained_tokens": self.trained[s]}
            idx_path = self.out / f"{s}_idx.npy"
            with atomic_path(idx_path) as tmp:
                with open(tmp, "wb") as f:
                    np.save(f, np.asarray(self.offsets[s], dtype="<i8"), allow_pickle=False)
            records[f"{s}_idx.npy"] = {**file_record(idx_path, None), "examples": len(self.offsets[s])}
        if self.log is not None:
            records.update(self.log.write(self.out, {s: len(self.offsets[s]) for s in ("train", "val")}))
        return records

    def abort(self) -> None:
        for f in self.files.values():
            f.abort()


def sft_meta(tokenizer, dtype, final: Path, writer: SFTWriter, *, records: dict, seed: int, val_frac: float,
             skipped: Counter, dataset_name, dataset_config, streaming: bool, source,
             tokenizer_path: str | None = None, encoders: Counter | None = None) -> dict:
    """An SFT cache's meta.json (the one-process builder and the parallel build's commit write the same one).
    A callable `source` is called here, once the stream is read, so its skip counts are final. `encoders`: a
    parallel build's tasks by the encoder each ran (None: this process's)."""
    if callable(source):
        source = source()
    if not writer.offsets["train"] and not writer.offsets["val"]:
        raise ConfigError(no_conversation_message(final, all_skipped(skipped, source), source))
    meta = common_meta(tokenizer, dtype, seed, dataset_name or final.name, dataset_config, streaming, source,
                       tokenizer_path)
    meta.update({
        "kind": "sft",
        "split_rule": sft_split_rule(seed, val_frac),
        "val_frac": val_frac,
        "rendering": (CHAT_TEMPLATE_RENDERING if writer.stored_mask else
                      "per message: role sentinel, content tokens, EOT; trained span = assistant content + its EOT"),
        "totals": {"train_examples": len(writer.offsets["train"]), "val_examples": len(writer.offsets["val"]),
                   "train_tokens": writer.tokens["train"], "val_tokens": writer.tokens["val"]},
        "files": records,
        "skipped": all_skipped(skipped, meta["source"]),
        "build": {"val_frac": val_frac, "seed": seed},
        **encoder_record(tokenizer, encoders, chat=True),
    })
    if writer.log is not None:  # origins.npy + origins.json (builders/origins.py)
        meta["origins"] = origins_meta()
    if writer.stored_mask:
        meta["assistant_mask"] = {"file": "{split}_mask.bin", "dtype": "uint8", "meaning": "1 = trained target"}
    return meta


def check_sft_settings(val_frac: float, seed: int) -> None:
    if not 0.0 <= val_frac < 1.0:
        raise ConfigError(f"val_frac must be in [0, 1), got {val_frac}")
    check_seed(seed)


@allocator.keeping
@writes_to_url
def build_sft_cache(
    examples: Iterable[list[Message]],
    out_dir: str,
    *,
    tokenizer,
    val_frac: float,
    seed: int,
    token_dtype: str | None = None,
    dataset_name: str | None = None,
    dataset_config: str | None = None,
    streaming: bool = False,
    source: dict | Callable[[], dict] | None = None,
    progress: bool | None = False,
    num_workers: int | None = 1,
    tokenizer_path: str | None = None,
    on_bad_record: str = "error",
) -> None:
    """Write out_dir/{train,val}_tokens.bin, {train,val}_idx.npy (int64 start offsets) and meta.json (last);
    deterministic given seed and stream order. `on_bad_record="skip"`: a conversation the renderer refuses
    (tool turns without a chat template) is skipped and counted."""
    check_sft_settings(val_frac, seed)
    final = Path(out_dir)
    with build_aside(final) as out:
        dtype = resolve_dtype(tokenizer, token_dtype)
        start_build(out, [])
        workers = _encode_threads(num_workers)
        skipped: Counter = Counter()
        located = hasattr(examples, "with_origins")  # a planned stream (builders/run.py): origins known
        writer = SFTWriter(out, dtype, stored_mask=not getattr(tokenizer, "library_conventions", True),
                           val_frac=val_frac, seed=seed, origins=located)
        try:
            stream = examples.with_origins() if located else ((conv, None) for conv in examples)
            shown = progress_bar(stream, unit="ex", desc=f"sft {dataset_name or final.name}", progress=progress)
            pairs = renderings(tokenizer, shown, on_bad_record, workers, conv_of=lambda pair: pair[0])
            for i, ((_, origin), chat) in enumerate(pairs):
                if isinstance(chat, Skipped):
                    skipped[chat.reason] += 1
                    continue
                if isinstance(chat, ConfigError):
                    raise ConfigError(f"{dataset_name or final.name} example {i}: {chat}") from chat
                ids = np.asarray(chat.ids, dtype=np.int64)
                check_range(ids, dtype, f"example {i}")
                writer.add(ids, np.asarray(chat.mask, dtype=np.uint8) if writer.stored_mask else None, origin)
            if located:
                writer.log.table = examples.origin_table()
            records = writer.close()
        except BaseException:
            writer.abort()
            raise
        meta = sft_meta(tokenizer, dtype, final, writer, records=records, seed=seed, val_frac=val_frac,
                        skipped=skipped, dataset_name=dataset_name, dataset_config=dataset_config,
                        streaming=streaming, source=source, tokenizer_path=tokenizer_path)
        write_meta(str(out), meta)

