"""Progress for long builds, on stderr: a bar on a terminal, a line every so often in a log.

- `progress=None` (the CLI's default): a bar on a terminal, else one line every PROGRESS_EVERY_S seconds
  (NIELS_GPT_PROGRESS_EVERY sets it) with the amount, rate and ETA; `True`: always a bar, `False`: nothing.
- With the input's size known (local text files) the bar counts the UTF-8 bytes of the documents read, so the
  ETA is real (a token budget is never the total: the input may end first); else it counts tokens.
Cost: nothing when the bar is off; one UTF-8 encode per document when it is on.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator

PROGRESS_EVERY_S = 30.0  # outside a terminal: one progress line every this many seconds
EVERY_ENV = "NIELS_GPT_PROGRESS_EVERY"


def should_show(progress: bool | None, stream=None) -> bool:
    """Whether a bar is shown: asked for, or by default on a terminal (see `mode` for the lines of a log)."""
    return mode(progress, stream) == "bar"


def mode(progress: bool | None, stream=None) -> str:
    """"bar" (a tqdm bar), "lines" (a line every few seconds, for a log) or "off"."""
    if progress is not None:
        return "bar" if progress else "off"
    try:
        return "bar" if (sys.stderr if stream is None else stream).isatty() else "lines"
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return "lines"


def every_s() -> float:
    try:
        return max(float(os.environ.get(EVERY_ENV, PROGRESS_EVERY_S)), 0.0)
    except ValueError:
        return PROGRESS_EVERY_S


def _amount(n: float, unit: str) -> str:
    if unit == "s":
        return f"{n:,.0f} s"
    for factor, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= factor:
            return f"{n / factor:.1f} {prefix}{unit}"
    return f"{n:,.0f} {unit}"


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Lines:
    """What a bar says, as one line every `every` seconds (for a log), through the part of tqdm's interface
    the builders use."""

    def __init__(self, iterable=None, *, desc: str = "", total: float | None = None, unit: str = "it",
                 initial: float = 0, every: float | None = None, stream=None, clock=time.monotonic, rate: bool = True,
                 **_ignored):
        self.iterable, self.desc, self.total, self.unit = iterable, desc, total, unit
        self.n, self.note, self.rate = initial, "", rate
        self.every = every_s() if every is None else every
        self.stream, self.clock = stream, clock
        self.start = self.last = clock()
        self.initial = initial
        self.printed = 0

    def __iter__(self):
        for x in self.iterable:
            yield x
            self.update(1)

    def line(self) -> str:
        now = self.clock()
        elapsed = max(now - self.start, 1e-9)
        out = f"{self.desc}: {_amount(self.n, self.unit)}"
        if self.total:
            out += f" of {_amount(self.total, self.unit)} ({100 * self.n / self.total:.0f}%)"
        if self.rate:
            speed = (self.n - self.initial) / elapsed
            out += f", {_amount(speed, self.unit)}/s"
            if self.total and speed > 0 and self.n < self.total:
                out += f", ETA {_clock((self.total - self.n) / speed)}"
        out += f", {_clock(elapsed)} elapsed" + (f"; {self.note}" if self.note else "")
        return out

    def _say(self) -> None:
        self.printed += 1
        print(self.line(), file=self.stream or sys.stderr, flush=True)

    def refresh(self) -> None:
        now = self.clock()
        if now - self.last >= self.every:
            self.last = now
            self._say()

    def update(self, n: float = 1) -> None:
        self.n += n
        self.refresh()

    def set_postfix_str(self, note: str, refresh: bool = True) -> None:
        self.note = note

    def close(self) -> None:
        """A last line, when the work was long enough to print any (so a log shows that it ended)."""
        if self.printed:
            self.printed = -1
            self._say()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Off(Lines):
    """A bar that is off: it counts and says nothing (and costs no tqdm import)."""

    disable = True  # as tqdm's disabled bar says

    def refresh(self) -> None:
        pass


def progress_bar(iterable=None, *, progress: bool | None, **kw):
    """A tqdm bar on a terminal (or when asked for), Lines in a log, a silent Off when off."""
    how = mode(progress)
    if how == "lines":
        return Lines(iterable, **kw)
    if how == "off":
        return Off(iterable, **kw)
    from tqdm.auto import tqdm

    kw.pop("rate", None)
    return tqdm(iterable, file=sys.stderr, **kw)


class BuildProgress:
    def __init__(self, desc: str, *, progress: bool | None, input_bytes: int | None = None, unit: str = "tok"):
        self.by_bytes = mode(progress) != "off" and bool(input_bytes)
        self.tokens = 0
        self._start = time.monotonic()
        self._last = 0.0
        self.bar = progress_bar(total=input_bytes if self.by_bytes else None, unit="B" if self.by_bytes else unit,
                                unit_scale=True, desc=desc, progress=progress)

    def documents(self, texts: Iterable[str]) -> Iterator[str]:
        """`texts`, their bytes counted when the bar runs on bytes (else no layer per document)."""
        if not self.by_bytes:
            return iter(texts)
        return self._counted(texts)

    def _counted(self, texts: Iterable[str]) -> Iterator[str]:
        for t in texts:
            if isinstance(t, str):  # a Skipped record of the stream has no text
                self.bar.update(len(t.encode("utf-8", "surrogatepass")))
            yield t

    def add_tokens(self, n: int) -> None:
        self.tokens += n
        if not self.by_bytes:
            self.bar.update(n)  # a bar that is off (Off) only counts
        elif time.monotonic() - self._last > 0.5:
            self._tokens_note()

    def _tokens_note(self) -> None:
        self._last = now = time.monotonic()
        rate = self.tokens / max(now - self._start, 1e-9)
        self.bar.set_postfix_str(f"{self.tokens:,} tok, {rate / 1e6:.2f} Mtok/s", refresh=False)

    def close(self, *, finished: bool = False) -> None:
        if self.by_bytes:
            self._tokens_note()
            if finished and self.bar.total and self.bar.n < self.bar.total:
                self.bar.update(self.bar.total - self.bar.n)  # JSON/markup overhead: the text is smaller
        self.bar.close()
