"""The fast encoder: gigatoken behind a tokenizer, used by the cache builder when it gives the very same ids.

    fast = fast_encoder(tokenizer)      # None: the tokenizer's own (reference) encoder is used
    ids = fast.encode_arrays(texts)     # one uint32 array per text; batch=True: GIL-free calls for them all

- gigatoken (in the `tiktoken` extra) encodes tiktoken encodings with a known split regex (r50k, cl100k, o200k),
  byte-level BPE tokenizer.json files and sentencepiece BPE models; anything else stays on the reference.
- It is checked id for id against the reference on `TORTURE` plus the tokenizer's special-token strings, and
  on a sample of the first batch a process encodes (`check_sample`; a parallel build's driver checks its first
  documents before its workers fork): a mismatch puts the tokenizer back on the reference encoder with one
  warning line. NIELS_GPT_ENCODER=reference always uses the reference.
- meta.json records it (`encoder_record`: {"encoder": "gigatoken 0.10.0"}); a parallel build's from what each
  task's receipt says it ran. The ids are the same either way. Chat rendering (SFT) encodes each message with
  it (`message_encoder`), checked on the first conversations' messages; a chat template's rendering (encoded
  whole, special tokens parsed) stays on the tokenizer's own library.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import os
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

ENV = "NIELS_GPT_ENCODER"  # "reference": never use the fast encoder
REFERENCE = "reference"  # a task receipt's encoder: the tokenizer's own library
SAMPLE_CHARS = 64 << 10  # characters of the first batch checked: 0.03 s of CPU a process for tiktoken
_LOCK = threading.Lock()
PAD_RATIO, PAD_MIN_BYTES = 1.3, 16 << 10  # a padded call: texts up to 1.3x the shortest's bytes (or 21 KB)
# a model's pretoken cache grows by ~100 bytes with each new word (16 M words: 1.5 GB) and is never emptied, so
MODEL_BYTES = 256 << 20  # a model is replaced by a new one once it has encoded this much text

TORTURE = [
    "", " ", "  ", "\n", "\n\n\n", "\t\t x", "a  b   c    d", "   leading", "trailing   ", " \n \n  \r\n\t",
    "0", "12", "123", "1234", "12345678901234567890", "3.14159 2,718 1e-9 0x1F -42 +7 1_000_000",
    "I'm you're he'll we've they'd it's don't I'M YOU'RE HE'LL 'S 'T", "rock 'n' roll o'clock l'été",
    "emoji 😀👍🏽👨‍👩‍👧‍👦 🇩🇪 ❤️ ✨✨✨", "日本語のテキストと漢字、中文字符。한국어 텍스트", "ไทย العربية עברית हिन्दी",
    "e\u0301 a\u0300\u0301\u0302 n\u0303 Z\u0351\u0352\u0353 \u00e9 \u212b \ufb01", "\u200b\u200c\u200d\ufeff zero width",
    "\ufffd\ufffd replacement \ufffd", "lone \ud800 surrogate \udfff", "\x00\x01\x07\x1b[0m control", "\u2028\u2029\u0085 separators",
    "x" * 3000, "ab" * 1500 + " " + "Z" * 2000, "🙂" * 500, "supercalifragilisticexpialidocious" * 40,
    "def f(x):\n    return x ** 2  # comment\n\n\n", "<html><body class=\"a\">&amp;&#x27;</body></html>",
    "Mixed CASE words ALLCAPS camelCase snake_case kebab-case", "!!!??? ... --- ___ *** ### @@@ $$$",
    "URL https://example.com/a?b=c&d=e#f email a.b@c.de", "     ".join(["indent"] * 20),
]


def torture_texts(tokenizer) -> list[str]:
    """TORTURE and the special-token strings of `tokenizer`: text for the encoder, which must encode them as text."""
    specials = ["<|endoftext|>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]
    enc = getattr(tokenizer, "_enc", None)
    if enc is not None:
        specials += list(enc._special_tokens)
    hf = getattr(tokenizer, "_tok", None)
    if hf is not None:
        specials += [t.content for t in hf.get_added_tokens_decoder().values()]
    return TORTURE + ["".join(specials), " ".join(f"x{s}y" for s in specials)]


def _version() -> str:
    from importlib.metadata import version
    return version("gigatoken")


def _build(gigatoken, tokenizer):
    """A gigatoken Tokenizer for `tokenizer`, or None where it has no such model (or `tokenizer` is a subclass
    of the library's tokenizers, whose encoder may not be its base's)."""
    # lazy: the backends import their libraries (tiktoken, tokenizers, sentencepiece) only when asked
    from niels_gpt.tokenizer import hf, spm, tiktoken_backend

    kind = type(tokenizer)
    if kind is tiktoken_backend.TiktokenTokenizer:
        enc = tokenizer._enc
        tb = tiktoken_backend
        scheme = {tb.R50K_PATTERN: "gpt2", tb.CL100K_PATTERN: "gpt4", tb.O200K_PATTERN: "o200k"}.get(enc._pat_str)
        if scheme is None:
            with contextlib.suppress(ImportError, AttributeError):
                from tiktoken_ext import openai_public as op
                scheme = {op.r50k_pat_str: "gpt2"}.get(enc._pat_str)
        if scheme is None:
            return None
        path = tokenizer._path
        if path.lower().endswith(".tiktoken") and os.path.isfile(path):  # the file tiktoken read: not written again
            return gigatoken.Tokenizer.from_tiktoken(path, pretokenizer=scheme, special_tokens={})
        lines = b"".join(base64.b64encode(t) + b" %d\n" % r
                         for t, r in sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1]))
        with tempfile.TemporaryDirectory(prefix="niels-gpt-ranks-") as d:
            path = os.path.join(d, "ranks.tiktoken")
            with open(path, "wb") as f:
                f.write(lines)
            return gigatoken.Tokenizer.from_tiktoken(path, pretokenizer=scheme, special_tokens={})
    if kind is hf.HFTokenizer:
        return _without_specials(gigatoken, tokenizer._tok.to_str())
    if kind is spm.SentencePieceTokenizer:
        # NOTE: gigatoken's own converter (what Tokenizer.from_sentencepiece calls), so that the control
        # pieces can be left out as below
        from gigatoken._load.sentencepiece import sentencepiece_to_tokenizer_json
        return _without_specials(gigatoken, sentencepiece_to_tokenizer_json(tokenizer._sp.serialized_model_proto()))
    return None


def _without_specials(gigatoken, tokenizer_json: str | bytes):
    """gigatoken's tokenizer of a tokenizer.json without its special added tokens: the library's encoders
    encode special-token strings in a document as text (HF: encode_special_tokens = True; sentencepiece:
    control pieces are never matched in text), gigatoken would give their ids."""
    import json
    config = json.loads(tokenizer_json)
    config["added_tokens"] = [t for t in config.get("added_tokens") or [] if not t.get("special")]
    return gigatoken.Tokenizer.from_json(json.dumps(config))


class FastEncoder:
    """gigatoken's encoder for one tokenizer, checked against it."""

    def __init__(self, giga, name: str, make: Callable | None = None):
        self.giga, self.name, self.sampled = giga, name, False
        self.batches = type(getattr(giga, "_backend", giga)).__name__ != "SentencePieceTokenizer"  # NOTE: performance.md
        self._make = make  # another model as `giga` was made: one for each call in parallel (`_models`)
        self._free, self._used, self._lock = [giga], {}, threading.Lock()

    @contextlib.contextmanager
    def _models(self, size: int = 0):
        """A model for a run of padded calls (`size` bytes) that no other call holds (threads sharing one take turns):
        a free one, the warmest first, else a new one made as `giga` was, lent until `_spent`; `_make` gives None
        for one failing the check text (its file replaced meanwhile): `giga` is then shared, and kept."""
        with self._lock:
            giga = self._free.pop() if self._free else None
        if giga is None and self._make is not None:
            with contextlib.suppress(Exception):  # any failure: share the checked model
                giga = self._make()
            self._make = self._make if giga is not None else None  # failed: from now on shared
        giga = giga or self.giga
        try:
            yield giga
        finally:
            with self._lock:
                if not self._spent(giga, size) and all(g is not giga for g in self._free):
                    self._free.append(giga)

    def _spent(self, giga, size: int) -> bool:
        """Count `size` bytes encoded by `giga` (under `_lock`); True once it has encoded MODEL_BYTES (and a new
        one can be made): it is then forgotten, and lent no more, its memory going with its last user."""
        used = self._used[id(giga)] = self._used.get(id(giga), 0) + size
        if used <= MODEL_BYTES or self._make is None:
            return False
        del self._used[id(giga)]
        self._free = [g for g in self._free if g is not giga]  # (a model replaced in `_renew` may be free too)
        return True

    def encode_arrays(self, texts: Sequence[str], batch: bool = False) -> list[np.ndarray]:
        """One uint32 array per text (None for one gigatoken cannot take, a lone surrogate: the caller uses the
        reference): an `encode` call each (it holds the GIL), or with `batch` padded calls that release it (`_padded`)."""
        if batch and texts:
            try:
                return self._padded(texts)
            except (ValueError, TypeError, UnicodeError, AttributeError):
                pass  # a text it cannot take (or an encoder without the batch call): one by one below
        encode = self.giga.encode
        out: list = []
        for t in texts:
            try:
                out.append(np.asarray(encode(t), dtype=np.uint32))
            except (ValueError, TypeError, UnicodeError):
                out.append(None)
        self._renew(sum(map(len, texts)))
        return out

    def _renew(self, size: int) -> None:
        """`size` bytes encoded by `giga` one document a call (as a build's worker encodes every task); once it is
        `_spent`, a new one made and checked as it was replaces it (it stays if that fails)."""
        with self._lock:
            if not self._spent(giga := self.giga, size):
                return
        with contextlib.suppress(Exception):  # any failure: the model as it is
            self.giga = self._make() or giga

    def _padded(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The texts' ids by padded calls (they release the GIL), texts of about one length a call (PAD_RATIO), each
        row a view. NOTE: given UTF-8 buffers, gigatoken imports no awkward (0.13-0.3 s; str would import it)."""
        from gigatoken.gigatoken_rs import BytesSource, PadTruncate

        raw = [t.encode("utf-8") for t in texts]
        order = sorted(range(len(raw)), key=lambda k: len(raw[k]))
        sizes = [len(raw[k]) for k in order]
        out: list = [None] * len(raw)
        i = 0
        with self._models(sum(sizes)) as giga:
            while i < len(order):
                j = bisect.bisect_right(sizes, PAD_RATIO * max(sizes[i], PAD_MIN_BYTES), i + 1)
                rows, lengths = giga._backend.encode_batch_padded(BytesSource([raw[k] for k in order[i:j]]),
                                                                  PadTruncate(0), parallel=False)
                for r, (k, n) in enumerate(zip(order[i:j], lengths.tolist(), strict=True)):
                    out[k] = rows[r, :n]
                i = j
        return out


def _mismatch(tokenizer, fast: FastEncoder, texts: Sequence[str]) -> int | None:
    """Index of the first text whose ids differ between the encoders (an encoder error counts), else None."""
    try:
        got = fast.encode_arrays(texts)
    except Exception:  # noqa: BLE001 - any failure of the fast encoder is a reason to use the reference
        return 0
    for i, (text, ids) in enumerate(zip(texts, got, strict=True)):
        if ids is not None and ids.tolist() != list(tokenizer.encode(text)):
            return i
    return None


def _warn(tokenizer, what: str) -> None:
    name = getattr(tokenizer, "_path", None) or getattr(tokenizer, "model_path", None) or type(tokenizer).__name__
    print(f"warning: the fast encoder (gigatoken) gives other ids than {name}'s own encoder on {what}; "
          "encoding with the tokenizer's own library (slower, same cache)", file=sys.stderr)


def fast_encoder(tokenizer) -> FastEncoder | None:
    """The checked fast encoder of `tokenizer` (made once per tokenizer object), or None."""
    if getattr(tokenizer, "__dict__", None) is None or os.environ.get(ENV, "") == "reference":
        return None  # NOTE: asked every time, so the setting holds for a tokenizer that made its fast encoder
    if "_fast_encoder" in tokenizer.__dict__:
        return tokenizer.__dict__["_fast_encoder"]
    with _LOCK:
        if "_fast_encoder" in tokenizer.__dict__:
            return tokenizer.__dict__["_fast_encoder"]
        fast = None
        try:
            import gigatoken
            giga = _build(gigatoken, tokenizer)
        except Exception:  # noqa: BLE001 - no gigatoken, or a model it cannot load: the reference encoder
            giga = None
        if giga is not None:
            name = f"gigatoken {_version()}"

            def make():  # another model, checked as this one is
                new = _build(gigatoken, tokenizer)
                bad = _mismatch(tokenizer, FastEncoder(new, name), torture_texts(tokenizer))
                return new if bad is None else None

            fast = FastEncoder(giga, name, make)
            bad = _mismatch(tokenizer, fast, torture_texts(tokenizer))
            if bad is not None:
                _warn(tokenizer, f"the built-in check text #{bad}")
                fast = None
        tokenizer.__dict__["_fast_encoder"] = fast
        return fast


def check_sample(tokenizer, fast: FastEncoder, texts: Sequence[str]) -> FastEncoder | None:
    """At the first batch: the sample (up to SAMPLE_CHARS characters of `texts`) checked id for id; a mismatch
    puts `tokenizer` on the reference encoder for good (returns None)."""
    if fast.sampled:
        return fast
    with _LOCK:  # the builder's other threads wait for the one check, then follow its verdict
        if fast.sampled:
            return tokenizer.__dict__.get("_fast_encoder")
        sample, chars = [], 0
        for t in texts:
            if chars + len(t) > SAMPLE_CHARS:  # the document's start: both encoders are given the same text
                if chars < SAMPLE_CHARS:
                    sample.append(t[:SAMPLE_CHARS - chars])
                break
            sample.append(t)
            chars += len(t)
        bad = _mismatch(tokenizer, fast, sample)
        if bad is not None:
            _warn(tokenizer, f"a document of the input ({sample[bad][:40]!r}...)")
            tokenizer.__dict__["_fast_encoder"] = None
        fast.sampled = True
        return fast if bad is None else None


def message_encoder(tokenizer, convs: Sequence) -> Callable[[str], Sequence[int]] | None:
    """For chat rendering: the fast encoder's `encode` of a message's content, checked (check_sample) on the
    messages of `convs` (the first conversations), or None: the tokenizer's own (always for a chat template)."""
    fast = _fast_for(tokenizer, chat=True)
    if fast is None:
        return None
    texts = [m["content"] for c in convs if isinstance(c, list) for m in c
             if isinstance(m, dict) and isinstance(m.get("content"), str) and m["content"]]
    if check_sample(tokenizer, fast, texts) is None:
        return None

    def encode_message(text: str, reference=tokenizer.encode) -> Sequence[int]:
        try:
            ids = fast.giga.encode(text)  # (the model of the moment: `_renew` replaces it after MODEL_BYTES)
        except (ValueError, TypeError, UnicodeError):
            return reference(text)  # a text gigatoken cannot take (a lone surrogate)
        fast._renew(len(text))
        return ids
    return encode_message


def encoder_name(tokenizer, chat: bool = False) -> str:
    """What encodes `tokenizer`'s documents (`chat`: messages) here: the fast encoder's name, or REFERENCE."""
    fast = _fast_for(tokenizer, chat)
    return fast.name if fast is not None else REFERENCE


def _fast_for(tokenizer, chat: bool) -> FastEncoder | None:
    """The fast encoder of `tokenizer`'s documents (`chat`: messages; a chat template's rendering is the
    tokenizer's own library's)."""
    return None if chat and getattr(tokenizer, "chat_template", None) is not None else fast_encoder(tokenizer)


def encoder_record(tokenizer=None, tasks: Counter | None = None, chat: bool = False) -> dict:
    """meta.json's record of the encoder that encoded a cache's documents (`chat`: messages): in this process
    (with `tokenizer`), or in a parallel build's tasks (`tasks`: receipts by encoder name). {} when the reference
    encoder encoded everything; "encoder_tasks" (tasks by encoder) when its tasks did not all use one."""
    tasks = tasks if tasks is not None else Counter([encoder_name(tokenizer, chat)])
    fast = sorted(name for name in tasks if name != REFERENCE)
    if not fast:
        return {}
    return {"encoder": ", ".join(fast), **({"encoder_tasks": dict(sorted(tasks.items()))} if len(tasks) > 1 else {})}
