"""A .tiktoken file gives its ranks; a damaged one is refused naming its line."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from niels_gpt.errors import TokenizerError
from niels_gpt.tokenizer.tiktoken_backend import _ranks_line_by_line, parse_ranks


def ranks_file(extra: list[bytes] = ()) -> bytes:
    tokens = [bytes([b]) for b in range(256)] + [b"th", b"the", b" the", "é".encode(), b"\x00\xff"]
    lines = [base64.b64encode(t) + b" %d" % r for r, t in enumerate(tokens)]
    return b"\n".join(lines + list(extra)) + b"\n"


def test_every_line_gives_its_token_rank():
    data = ranks_file()
    ranks = parse_ranks(data, Path("x.tiktoken"))
    assert len(ranks) == 261 and ranks[b" the"] == 258 and ranks[b"\x00\xff"] == 260
    crlf = data.replace(b"\n", b"\r\n") + b"\n"  # CRLF line ends and a blank line are accepted alike
    assert parse_ranks(crlf, Path("x.tiktoken")) == parse_ranks(data, Path("x.tiktoken"))
    # the one-pass reading gives what the line-by-line one gives (which names a damaged file's line)
    assert list(ranks.items()) == list(_ranks_line_by_line(data, Path("x.tiktoken")).items())


@pytest.mark.parametrize("extra, says", [
    ([b"dGhl 999"], "already ranked on line"),  # a token twice
    ([b"eHl6 3"], "rank 3 was already given on line 4"),
    ([b"eHl6 -1"], "rank -1 below 0"),
    ([b"eH*6 300"], "not a .tiktoken file"),
    ([b"eHl6"], "not a .tiktoken file"),
    ([b"eHl6 30 0"], "not a .tiktoken file"),
    ([b"eHl 300"], "not a .tiktoken file"),  # bad padding
    ([b"eHl6 x"], "not a .tiktoken file"),
])
def test_a_damaged_file_is_refused_naming_its_line(extra, says):
    data = ranks_file(extra)
    with pytest.raises(TokenizerError, match=says) as exc:
        parse_ranks(data, Path("x.tiktoken"))
    assert ": line 262" in str(exc.value) or "already" in says


def test_a_missing_single_byte_is_refused():
    data = b"\n".join(line for line in ranks_file().splitlines() if not line.startswith(base64.b64encode(b"A")))
    with pytest.raises(TokenizerError, match="no rank for the single byte"):
        parse_ranks(data, Path("x.tiktoken"))
