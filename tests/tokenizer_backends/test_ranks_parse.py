"""A .tiktoken file read in one pass gives the ranks, and the refusals, of the line-by-line reading."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from niels_gpt.errors import TokenizerError
from niels_gpt.tokenizer.tiktoken_backend import _checked_ranks, parse_ranks


def ranks_file(extra: list[bytes] = ()) -> bytes:
    tokens = [bytes([b]) for b in range(256)] + [b"th", b"the", b" the", "é".encode(), b"\x00\xff"]
    lines = [base64.b64encode(t) + b" %d" % r for r, t in enumerate(tokens)]
    return b"\n".join(lines + list(extra)) + b"\n"


def test_the_one_pass_reading_gives_the_line_by_line_ranks():
    data = ranks_file()
    assert parse_ranks(data, Path("x.tiktoken")) == _checked_ranks(data, Path("x.tiktoken"))
    assert len(parse_ranks(data, Path("x.tiktoken"))) == 261
    crlf = data.replace(b"\n", b"\r\n") + b"\n"  # CRLF line ends and a blank line are accepted alike
    assert parse_ranks(crlf, Path("x.tiktoken")) == parse_ranks(data, Path("x.tiktoken"))


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
