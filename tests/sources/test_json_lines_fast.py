"""JSON Lines parsed by msgspec give exactly what `json` gives: the same records, the same errors, line by line."""

from __future__ import annotations

import json
import math
import random
import threading
from types import SimpleNamespace

import pytest

from niels_gpt.sources import lines
from niels_gpt.sources.text_io import BadRecord

pytest.importorskip("msgspec")

TRICKY = [
    b'{"text": "plain"}', b'{"text": "esc \\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\u20ac"}',
    b'{"text": "pair \\ud83d\\ude00"}', b'{"text": "lone \\ud800"}', b'{"text": "low first \\udfff\\ud800"}',
    b'{"\\ud800": "lone in a key"}', b'{"text": "lowercase \\uDBFF\\uDFFF"}', b'{"a": NaN}', b'{"a": Infinity}',
    b'{"a": -Infinity}', b'{"a": 1e400}', b'{"a": -1e400}', b'{"a": 1e-400}', b'{"a": -0.0}', b'{"a": -0}',
    b'{"a": 123456789012345678901234567890}', b'{"a": 18446744073709551615}', b'{"a": 18446744073709551616}',
    b'{"a": -9223372036854775808}', b'{"a": -9223372036854775809}', b'{"a": 12345678901234567890.5}',
    b'{"a": 1.7976931348623157e308}', b'{"a": 2.2250738585072011e-308}', b'{"a": 5e-324}', b'{"a": 0.1}',
    b'{"a": 1E5}', b'{"a": 01}', b'{"a": [1,]}', b'{"a": 1,}', b'{"a": 1, "b": 2, "a": 3}', b'{"a": {"a": 1, "a": {}}}',
    b'[1, 2]', b'"text"', b'3', b'null', b'{"a": 1}{"b": 2}', b'{"a": 1} x', b'{"a": "x\ty"}', b'{"a": "\x7f\xc2\x80"}',
    b'{"a": "\\u0000"}', b'{"a": "\xed\xa0\x80"}', b'{"a": "\xff"}', b'{"a": "\xc3"}', b'{"a": 1}\x0c', b' \t{"a": 1}\r\n',
    b'{"a": 1e}', b'{"a": .5}', b'{"a": tru}', b'{a: 1}', b"{'a': 1}", b'{"a": "\xe2\x80\xa8\xe2\x80\xa9"}',
    b'{"a": [' * 200 + b']' * 200 + b'}', b'{"a": ' + b'[' * 5000 + b']' * 5000 + b'}', b'\x00',
    b'{"text": "' + "ünïcödé 日本 😀".encode() * 50 + b'"}',
]


def _both(raw: bytes, monkeypatch) -> tuple:
    out = []
    for fast in (lines._fast_loads, None):
        monkeypatch.setattr(lines, "_fast_loads", fast)
        try:
            got = lines._parse(raw + b"\n", "f.jsonl, line 7", 100)
        except RecursionError:
            got = "RecursionError"
        out.append((got.reason, str(got)) if isinstance(got, BadRecord) else got)
    return tuple(out)


def test_the_fast_parser_is_in_use_where_msgspec_is_installed():
    assert lines._fast_loads is not None


@pytest.mark.parametrize("raw", TRICKY, ids=range(len(TRICKY)))
def test_fast_path_gives_the_records_and_errors_of_json(raw, monkeypatch):
    fast, reference = _both(raw, monkeypatch)
    assert repr(fast) == repr(reference)  # repr: nan == nan, -0.0 against 0.0, int against float


def test_fast_path_equals_json_on_random_numbers_and_strings(monkeypatch):
    rng = random.Random(0)
    alphabet = ["a", " ", "\\n", "\\\"", "\\u00e9", "é", "日", "😀", "\\ud83d\\ude00", "\\\\", "\t"]
    for _ in range(3000):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 25))).lstrip("0") or "0"
        number = rng.choice([digits, "-" + digits, f"{digits}.{rng.randint(0, 10**rng.randint(1, 20))}",
                             f"{digits}e{rng.randint(-330, 330)}", repr(rng.uniform(-1e300, 1e300)),
                             repr(rng.random() * 10 ** rng.randint(-320, 300))])
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        raw = f'{{"n": {number}, "text": "{text}", "k": [{number}, {{"x": "{text}"}}]}}'.encode()
        fast, reference = _both(raw, monkeypatch)
        assert repr(fast) == repr(reference), raw


def test_floats_are_the_same_float(monkeypatch):
    rng = random.Random(1)
    for _ in range(2000):
        x = rng.uniform(-1, 1) * 10 ** rng.randint(-300, 300)
        for s in (repr(x), f"{x:.17g}", f"{x:.25e}"):
            fast, reference = _both(f'{{"x": {s}}}'.encode(), monkeypatch)
            assert fast == reference and (math.copysign(1, fast["x"]) == math.copysign(1, reference["x"]))


def test_a_byte_range_reads_the_same_records_either_way(tmp_path, monkeypatch):
    path = tmp_path / "tricky.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"\n\n".join(TRICKY[:-3]) + b"\n  \n")
    piece = SimpleNamespace(item=str(path), start=0, stop=path.stat().st_size, kind=".jsonl")
    runs = []
    for fast in (lines._fast_loads, None):
        monkeypatch.setattr(lines, "_fast_loads", fast)
        runs.append([(str(w), (r.reason, str(r)) if isinstance(r, BadRecord) else r)
                     for w, r in lines.json_lines(piece, None)])
    assert repr(runs[0]) == repr(runs[1])
    assert len(runs[0]) == len(TRICKY) - 3
    assert runs[0][0] == (f"{path}, line 1", {"text": "plain"})
    assert str(runs[0][3][0]) == f"{path}, line 7"  # blank lines counted, the BOM dropped
    assert runs[0][3][1][0] == "invalid_text" and json.loads(TRICKY[0]) == runs[0][0][1]


def _read(path, ranges) -> int:
    from niels_gpt.sources.records import Piece
    return sum(1 for a, b in ranges for _ in lines._range_records(Piece(item=str(path), kind=".jsonl", start=a, stop=b)))


def test_file_sha256_comes_from_ranges_read_in_order_and_follows_a_rewrite(tmp_path, monkeypatch):
    import hashlib
    import os
    path = tmp_path / "d.jsonl"
    data = b"".join(b'{"text": "document %d"}\n' % i for i in range(50))
    path.write_bytes(data)
    cut = data.index(b"\n", 300) + 1
    assert _read(path, [(cut, len(data)), (0, cut)]) == 50  # out of order: nothing kept
    assert str(path) not in lines._HASHED
    assert _read(path, [(0, cut), (cut, len(data))]) == 50
    want = "sha256:" + hashlib.sha256(data).hexdigest()
    assert lines._HASHED[str(path)][1] == want
    monkeypatch.setattr(lines.hashlib, "sha256", None)  # kept: not read and hashed again
    assert lines.file_sha256(str(path)) == want
    monkeypatch.undo()
    path.write_bytes(data.replace(b"document 7", b"document X"))
    os.utime(path, ns=(1, 1))
    stopped = threading.Event()
    stopped.set()
    assert lines.file_sha256(str(path), stopped) is None  # a build that ended stops hashing its inputs
    assert lines.file_sha256(str(path)) == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_hash_ahead_keeps_a_digest_for_file_sha256_unless_the_file_changed_meanwhile(tmp_path, monkeypatch):
    """An inline build hashes its inputs that are not JSON Lines (read some other way) on a thread of its own
    while it reads them, for the input table at its end; a file changed while hashed is left to file_sha256,
    and a stopped build stops hashing."""
    import hashlib

    a, b = tmp_path / "a.parquet", tmp_path / "b.txt"
    a.write_bytes(b"x" * 3_000_000)
    b.write_bytes(b"some text\n" * 1000)
    lines.hash_ahead([str(a), str(b)], threading.Event())
    for p in (a, b):
        assert lines._HASHED[str(p)][1] == "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest()
    monkeypatch.setattr(lines, "sha256_file", lambda *_: pytest.fail("hashed again"))
    assert lines.file_sha256(str(a)) == "sha256:" + hashlib.sha256(a.read_bytes()).hexdigest()
    monkeypatch.undo()

    real = lines.sha256_file

    def changing(path, stop=None):  # the file is rewritten while it is hashed
        digest = real(path, stop)
        with open(path, "ab") as f:
            f.write(b"more")
        return digest

    lines._HASHED.clear()
    monkeypatch.setattr(lines, "sha256_file", changing)
    lines.hash_ahead([str(b)], threading.Event())
    assert str(b) not in lines._HASHED
    monkeypatch.undo()
    assert lines.file_sha256(str(b)) == "sha256:" + hashlib.sha256(b.read_bytes()).hexdigest()
    stopped = threading.Event()
    stopped.set()
    lines.hash_ahead([str(a)], stopped)
    assert str(a) not in lines._HASHED  # a stopped build hashes no more


def test_an_inline_build_hashes_its_parquet_inputs_on_a_thread_while_it_reads(tokenizer, tmp_path, monkeypatch):
    import hashlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    from niels_gpt.builders.run import BuildSpec, build

    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": [f"document {i} " * 50 for i in range(300)]}), path, row_group_size=50)
    threads = []
    real = lines.sha256_file
    monkeypatch.setattr(lines, "sha256_file", lambda p, stop=None: threads.append(
        (p, threading.current_thread().name)) or real(p, stop))
    lines._HASHED.clear()
    build(BuildSpec(sources=[str(path)], out=str(tmp_path / "c"), tokenizer=tokenizer.model_path, executor="inline",
                    progress=False))
    assert (str(path), "input-sha256") in threads and all(name == "input-sha256" for _, name in threads)
    table = json.loads((tmp_path / "c" / "origins.json").read_text())
    entry = table[0] if isinstance(table, list) else table["inputs"][0]
    assert entry["sha256"] == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_callers_of_file_sha256_hash_a_file_once_and_a_reader_is_not_held_up(tmp_path, monkeypatch):
    """The second caller waits for the digest being made; the reader's running hash (`_hash_read`, under the
    module's lock) goes on meanwhile."""
    import hashlib
    import time

    path = tmp_path / "a.parquet"
    path.write_bytes(b"y" * 1_000_000)
    made, real = [], lines.sha256_file
    started = threading.Event()

    def slow(p, stop=None):
        made.append(p)
        started.set()
        time.sleep(0.3)
        return real(p, stop)

    monkeypatch.setattr(lines, "sha256_file", slow)
    lines._HASHED.clear()
    got = []
    threads = [threading.Thread(target=lambda: got.append(lines.file_sha256(str(path)))) for _ in range(2)]
    threads[0].start()
    started.wait(10)
    threads[1].start()
    t0 = time.perf_counter()
    with lines._LOCK:  # what _hash_read takes: free while the file is hashed
        held = time.perf_counter() - t0
    for t in threads:
        t.join(10)
    want = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert got == [want, want] and made == [str(path)] and held < 0.2
