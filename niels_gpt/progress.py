"""Progress bars for long builds: on stderr, shown on a terminal only unless asked for.

- `progress=None` (the CLI's default): a bar when stderr is a terminal, nothing in a log file or a pipe;
  `True` always, `False` never.
- When the size of the input is known (local text files), the bar counts the UTF-8 bytes of the
  documents consumed against it, so the rate is bytes/s and the ETA is real; tokens and tokens/s
  ride beside it. A token budget is never the bar's total: the input may end long before it.
- When the size is unknown (a hub stream, Parquet), the bar counts tokens with their rate and no total.
Cost: nothing when the bar is off; one UTF-8 encode per document when it is on.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence

TEXT_SUFFIXES = (".txt", ".md", ".raw", ".jsonl", ".json")


def should_show(progress: bool | None, stream=None) -> bool:
    if progress is not None:
        return bool(progress)
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def text_input_bytes(files: Sequence[str | os.PathLike]) -> int | None:
    """Bytes of the input when every file is uncompressed text whose size tracks its documents' bytes."""
    files = list(files)
    if not files or any(os.path.splitext(str(f))[1].lower() not in TEXT_SUFFIXES for f in files):
        return None
    try:
        return sum(os.path.getsize(f) for f in files)
    except OSError:
        return None


class BuildProgress:
    def __init__(self, desc: str, *, progress: bool | None, input_bytes: int | None = None, unit: str = "tok"):
        from tqdm.auto import tqdm

        self.enabled = should_show(progress)
        self.by_bytes = self.enabled and bool(input_bytes)
        self.tokens = 0
        self._start = time.monotonic()
        self._last = 0.0
        self.bar = tqdm(total=input_bytes if self.by_bytes else None, unit="B" if self.by_bytes else unit,
                        unit_scale=True, desc=desc, disable=not self.enabled, file=sys.stderr)

    def documents(self, texts: Iterable[str]) -> Iterator[str]:
        """Pass `texts` through, counting their bytes when the bar runs on bytes."""
        if not self.by_bytes:
            yield from texts
            return
        for t in texts:
            if isinstance(t, str):  # a Skipped record of the stream has no text
                self.bar.update(len(t.encode("utf-8", "surrogatepass")))
            yield t

    def add_tokens(self, n: int) -> None:
        self.tokens += n
        if not self.enabled:
            return
        if not self.by_bytes:
            self.bar.update(n)
            return
        now = time.monotonic()
        if now - self._last > 0.5:
            self._last = now
            rate = self.tokens / max(now - self._start, 1e-9)
            self.bar.set_postfix_str(f"{self.tokens:,} tok, {rate / 1e6:.2f} Mtok/s", refresh=False)

    def close(self, *, finished: bool = False) -> None:
        if self.by_bytes:
            rate = self.tokens / max(time.monotonic() - self._start, 1e-9)
            self.bar.set_postfix_str(f"{self.tokens:,} tok, {rate / 1e6:.2f} Mtok/s", refresh=False)
        if self.by_bytes and finished and self.bar.total and self.bar.n < self.bar.total:
            self.bar.update(self.bar.total - self.bar.n)  # JSON/markup overhead: the text is smaller than the files
        self.bar.close()
