"""The rules of the layouts that rebuild a document or a conversation: gutenberg, wikitext, dolly and alpaca
(docs/sources.md, "Normalisation"; oasst's are sources/oasst_trees.py). One wikitext article in memory at
a time; a Gutenberg file that breaks its rule is an error naming the line, a dolly or alpaca record a bad record.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from niels_gpt.errors import SourceError
from niels_gpt.sources.text_io import BadRecord

GUTENBERG_START = re.compile(r"^\*\*\*\s*START OF\b.*$", re.MULTILINE | re.IGNORECASE)
GUTENBERG_END = re.compile(r"^\*\*\*\s*END OF\b", re.MULTILINE | re.IGNORECASE)
# "End of the Project Gutenberg EBook of <title>, by <author>", often wrapped over two lines, just
# before the END marker: licence boilerplate too. Looked for only in the body's last TAIL_CHARS.
GUTENBERG_END_LINE = re.compile(r"^End of (the )?Project Gutenberg", re.MULTILINE | re.IGNORECASE)
TAIL_CHARS = 400
READ_AS_TEXT = ("To read it anyway as plain text, licence included, pass --format text (`build FILE --format text`), "
                "or add the missing line")
WIKITEXT_MARKERS = {" @-@ ": "-", " @,@ ": ",", " @.@ ": "."}


def gutenberg_books(text: str, path: Path | str = "<text>") -> list[str]:
    """Every book of a Project Gutenberg file (module docstring)."""
    books, pos = [], 0
    while (start := GUTENBERG_START.search(text, pos)) is not None:
        end = GUTENBERG_END.search(text, start.end())
        if end is None:
            raise SourceError(f"{path}: a '*** START OF' line but no '*** END OF ...' line after it (the START is "
                              f"line {_line(text, start.start())}), so the licence footer cannot be cut off; is the "
                              f"file truncated? {READ_AS_TEXT}")
        second = GUTENBERG_START.search(text, start.end(), end.start())
        if second is not None:
            raise SourceError(f"{path}: a second '*** START OF' line (line {_line(text, second.start())}) before "
                              f"the first book's '*** END OF' line (line {_line(text, end.start())}); each book "
                              "needs its own START/END pair: fix the markers or split the file into one book each")
        body = text[start.end():end.start()].rstrip()
        ends = list(GUTENBERG_END_LINE.finditer(body, max(len(body) - TAIL_CHARS, 0)))
        if ends:
            body = body[:ends[-1].start()]
        books.append(body.strip())
        pos = end.end()
    if not books:
        raise SourceError(f"{path}: no '*** START OF ...' line, so the Project Gutenberg licence header "
                          "cannot be cut off; remove this file from the gutenberg directory or cut the "
                          "header by hand")
    return books


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def is_article_heading(line: str) -> bool:
    """` = Title = ` but not ` = = Section = = `."""
    s = line.strip()
    return len(s) > 4 and s.startswith("= ") and s.endswith(" =") and not s.startswith("= =")


def normalise_line(line: str) -> str:
    for marker, plain in WIKITEXT_MARKERS.items():
        line = line.replace(marker, plain)
    return line.strip()


def rebuild_articles(lines: Iterable[str], skipped) -> Iterator[str]:
    """Whole articles from wikitext line rows (see the module docstring for the rules); `skipped` a Counter."""
    current: list[str] | None = None
    for raw in lines:
        if is_article_heading(raw):
            if current is not None:
                yield from _emit(current, skipped)
            current = [normalise_line(raw)]
            continue
        line = normalise_line(raw)
        if not line:
            continue
        if current is None:
            skipped["before_first_heading"] += 1
            continue
        current.append(line)
    if current is not None:
        yield from _emit(current, skipped)


def _emit(lines: list[str], skipped) -> Iterator[str]:
    if len(lines) == 1:
        skipped["empty_document"] += 1
        return
    yield "\n".join(lines)


# layout -> its fields (instruction, the extra one, the response), whether the extra may be absent, the user turn
INSTRUCTION_LAYOUTS = {"dolly": (("instruction", "context", "response"), False, "{instruction}\n\nContext:\n{context}"),
                       "alpaca": (("instruction", "input", "output"), True, "{instruction}\n\n{input}")}


def instruction_conversation(row: dict, where, layout: str) -> list[dict] | str:
    """The two turns of one dolly or alpaca record (its fields stripped: the instruction, with the layout's template
    when the extra field is not empty, then the response), or the reason it is skipped; a BadRecord when a field
    is missing (alpaca's input may be) or not text."""
    (instruction, extra, response), optional, template = INSTRUCTION_LAYOUTS[layout]
    values = {}
    for field in (instruction, extra, response):
        v = row.get(field)
        if (field not in row and not (optional and field == extra)) or not (v is None or isinstance(v, str)):
            absent = field not in row
            raise BadRecord("missing_field" if absent else "not_text",
                            f"{where}: field {field!r} is {'missing' if absent else type(v).__name__} (fields: "
                            f"{sorted(row)}); {layout} records hold {instruction}, {extra} and {response} as text"
                            + (f" ({extra} optional)" if optional else ""))
        values[field] = (v or "").strip()
    if not values[response]:
        return "no_assistant_turn"
    if not values[instruction]:
        return "empty_user_turn"
    prompt = template.format(**values) if values[extra] else values[instruction]
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": values[response]}]
