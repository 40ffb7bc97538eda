"""The library's tokenizer trained on any sources `build` reads: `train-tokenizer SRC... --out DIR`.

    niels-gpt-data train-tokenizer my-data/ --out tok --vocab-size 4000
    niels-gpt-data build my-data/ --out cache/mine --train-tokenizer 4000    # into cache/tokenizer, then the cache

- The sources are read through the same plan as `build` (every layout; chats give their messages' text).
- Two phases on stderr: reading (characters, with an ETA when the input's size is known), then training, shown
  against an estimate from SECONDS_PER_MCHAR (`python bench/bench_entrance.py`). `--max-chars N` trains on a
  seeded sample of N characters (niels_gpt/tokenizer/spm.py).
- The output is built aside and swapped in (niels_gpt/staging.py); meta.json records the plan's description.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from niels_gpt.builders.plan import make_plan
from niels_gpt.constants import META_NAME
from niels_gpt.errors import ConfigError
from niels_gpt.meta import read_meta
from niels_gpt.output_guard import OutputRefused, check_output
from niels_gpt.progress import mode, progress_bar
from niels_gpt.sources.documents import Rules
from niels_gpt.sources.stream import check_unchanged
from niels_gpt.sources.stream import stream_items as plan_items
from niels_gpt.staging import build_aside
from niels_gpt.storage.upload import local_path_of
from niels_gpt.tokenizer import TrainSettings, load_tokenizer, train_tokenizer
from niels_gpt.tokenizer.spm import MIN_VOCAB, NoTrainingText, VocabSizeError, check_train_settings
from niels_gpt.tokenizer.tiktoken_backend import check_rustbpe_settings

SECONDS_PER_MCHAR = {"unigram": 9.0, "bpe": 0.5, "rustbpe": 0.15}  # training time per million characters


def texts_of(items: Iterable) -> Iterator[str]:
    """Training text from a plan's items: each document, or each message of each conversation."""
    for item in items:
        if isinstance(item, str):
            yield item
        elif isinstance(item, list):
            yield from (m["content"] for m in item if isinstance(m, dict) and m.get("content"))


class _Phases:
    """Reading, then training: a bar each (niels_gpt/progress.py)."""

    def __init__(self, settings: TrainSettings, total_chars: int | None, progress: bool | None,
                 trainer: str = "sentencepiece"):
        self.settings, self.progress = settings, progress
        self.kind = "rustbpe" if trainer == "rustbpe" else settings.model_type
        self.enabled = mode(progress) != "off"
        self.limit = settings.max_train_chars
        total = min(total_chars, self.limit) if total_chars else None
        self.bar = progress_bar(total=total, unit="char", unit_scale=True, desc="tokenizer: reading text",
                                progress=progress)
        self.chars = 0
        self.read_done = threading.Event()
        self.trained = threading.Event()
        self.ticker = threading.Thread(target=self._training_bar, daemon=True)
        self.ticker.start()

    def texts(self, texts: Iterable[str]) -> Iterator[str]:
        for t in texts:
            self.chars += len(t)
            self.bar.update(len(t))
            yield t
            if self.chars >= self.limit:
                break
        self.read_done.set()

    def _training_bar(self) -> None:
        self.read_done.wait()
        self.bar.close()
        if not self.enabled:
            return
        rate = SECONDS_PER_MCHAR.get(self.kind, 9.0)
        estimate = max(1, round(min(self.chars, self.limit) / 1e6 * rate))
        bar = progress_bar(total=estimate, unit="s", desc=f"tokenizer: training ({self.kind}, "
                           f"{self.settings.vocab_size:,} pieces, about {estimate} s)", progress=self.progress,
                           bar_format="{desc}: {n:.0f}/{total:.0f} s {bar}", rate=False)
        bar.refresh()
        t0 = time.monotonic()
        while not self.trained.wait(0.5):
            bar.n = min(time.monotonic() - t0, bar.total * 0.99)
            bar.refresh()
        bar.n = bar.total
        bar.close()

    def close(self) -> None:
        self.read_done.set()
        self.trained.set()
        self.ticker.join(5)


def train_on_sources(sources, out, *, settings: TrainSettings, rules: Rules | None = None, chat: bool = False,
                     layout: str | None = None, config: str | None = None, split: str = "train",
                     progress: bool | None = None, read_as: dict[str, str] | None = None,
                     trainer: str = "sentencepiece"):
    """Train the library's tokenizer on `sources` into the directory `out` (--out); returns it."""
    if trainer == "rustbpe":
        check_rustbpe_settings(settings)
    else:
        check_train_settings(settings)
    if local_path_of(out) is None:
        raise ConfigError(f"--out {out}: a tokenizer is written to a local directory; upload it afterwards if needed")
    out = check_output(Path(local_path_of(out)), kind="tokenizer", inputs=sources)
    plan = make_plan(sources, tokenizer=None, rules=rules, chat=chat, layout=layout, config=config, split=split,
                     read_as=read_as)
    trained_on = {**plan.describe(), "rule": "every document (every message with --chat), in order, up to "
                  f"max_train_chars={settings.max_train_chars:,}"}
    total = sum(sig[0] for sig in plan.signatures.values()) if len(plan.signatures) == len(plan.inputs) else None
    phases = _Phases(settings, total, progress, trainer)
    try:
        with build_aside(out, kind="tokenizer", flag="--out") as stage:
            train_tokenizer(phases.texts(texts_of(plan_items(plan, check_at_end=False))), stage, settings=settings,
                            trained_on=trained_on, trainer=trainer)
            check_unchanged(plan)
    except NoTrainingText:
        named = ", ".join(plan.inputs[:3]) + (f" and {len(plan.inputs) - 3} more" if len(plan.inputs) > 3 else "")
        raise NoTrainingText(f"{named}: {'empty' if plan.inputs and not any(plan.sizes.values()) else 'only whitespace'}"
                             ", so there is no text to train the tokenizer on; give files that hold text (or "
                             "--text-field naming the field that does)") from None
    finally:
        phases.close()
    return load_tokenizer(out)


def tokenizer_for_build(spec, vocab_size: int, *, progress: bool | None = None) -> str:
    """`build --train-tokenizer VOCAB`: <out's parent>/tokenizer, trained on the build's sources (or reused when
    it was trained on the same sources with the same settings)."""
    if local_path_of(spec.out) is None:
        raise ConfigError(f"--train-tokenizer with --out {spec.out}: train the tokenizer locally first "
                          "(train-tokenizer SRC... --out DIR), then build with --tokenizer DIR")
    where = Path(local_path_of(spec.out)).resolve().parent / "tokenizer"
    if vocab_size < MIN_VOCAB:
        raise ConfigError(f"--train-tokenizer {vocab_size}: must be at least {MIN_VOCAB} (the model always holds 256 "
                          "byte pieces and 3 control pieces, plus one piece per character); 4,000 to 64,000 are usual")
    settings = TrainSettings(vocab_size=vocab_size, seed=spec.seed)
    check_train_settings(settings)
    if (where / META_NAME).is_file():
        meta = read_meta(str(where))
        plan = make_plan(spec.sources, tokenizer=None, rules=spec.rules, chat=spec.chat, layout=spec.layout,
                         config=spec.hf_config, split=spec.split, read_as=spec.read_as)
        same = (meta.get("settings") or {}).get("vocab_size") == vocab_size and \
            (meta.get("trained_on") or {}).get("files") == plan.describe()["files"]
        if not same:
            raise ConfigError(f"{where}: holds a tokenizer trained on other text or settings, which caches beside it "
                              f"may use; build with --tokenizer {where}, or choose another --out directory")
        print(f"build: reusing {where} (trained on the same sources, {vocab_size} pieces)", file=sys.stderr)
        return str(where)
    try:
        train_on_sources(spec.sources, where, settings=settings, rules=spec.rules, chat=spec.chat, layout=spec.layout,
                         config=spec.hf_config, split=spec.split, progress=progress, read_as=spec.read_as)
    except VocabSizeError as e:
        raise e.for_flag("--train-tokenizer", None) from None
    except OutputRefused as e:  # it names the tokenizer's directory as --out: say where that directory comes from
        said = str(e).removeprefix(f"--out {where}")
        raise OutputRefused(f"{where} (where --train-tokenizer writes the tokenizer it trains: beside --out){said} "
                            "(or train it elsewhere with `train-tokenizer SRC... --out DIR` and build with --tokenizer "
                            "DIR)") from None
    return str(where)
