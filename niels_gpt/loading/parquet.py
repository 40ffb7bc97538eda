"""Streaming pretraining batches from Parquet text shards, tokenized on the fly, for DDP.

- rank r of W reads row groups r, r+W, ... of all files; a document is [BOS] + encode(text), numbered by
  doc id in the rank's stream;
- "contiguous": one token stream, a batch the next B*T+1 tokens; "bestfit": rows packed by bestfit.py;
- the state is a position in doc ids, so resuming is exact (nanochat skips to the next row group);
- `prefetch=N` makes batches up to N ahead in the background (ahead.py); the state stays the last handed out.

Cost: tokenization dominates (figures: docs/loading.md, bench/bench_loading.py).
"""

from __future__ import annotations

import bisect
import os
from collections import OrderedDict, deque
from pathlib import Path

import numpy as np
import torch

from niels_gpt.errors import ConfigError, SourceError, StateError
from niels_gpt.loading.ahead import Prefetcher, resolve_mode
from niels_gpt.loading.bestfit import BUFFER_SIZE, BestFitPacker
from niels_gpt.loading.prefetch import local_world_size
from niels_gpt.long_documents import encode_whole
from niels_gpt.readers.checks import count
from niels_gpt.resume import STATE_VERSION, check_state, fingerprint, resolve_rank, state_int, state_ints
from niels_gpt.urls import is_url

TEXT_COLUMN = "text"
TOKENIZER_BATCH_SIZE = 128
PACKINGS = ("contiguous", "bestfit")
PARQUET_KIND = "parquet_token_loader"
OPEN_FILES = 4  # Parquet files a rank keeps open at once
PREFETCH = 4  # batches made ahead in the background by default (train's --prefetch default)


def rank_threads() -> int:
    """Encode threads of one rank: the cores this process may run on, shared by the ranks of its node."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on macOS and Windows
        cores = os.cpu_count() or 1
    return max(1, cores // local_world_size())


def _read_metadata(path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(path)
    except (OSError, pa.ArrowException) as exc:
        raise SourceError(f"{path}: not a readable Parquet file ({exc}); re-download it") from exc


def list_parquet_files(data_dir: str | os.PathLike) -> list[Path]:
    """Sorted *.parquet of a directory (half-downloaded *.tmp files are not listed)."""
    d = Path(data_dir)
    if not d.is_dir():
        raise SourceError(f"{d}: no such directory of Parquet shards; run `download` first")
    return sorted(p for p in d.iterdir() if p.suffix == ".parquet" and p.is_file())


def split_files(data_dir: str | os.PathLike, split: str) -> list[Path]:
    """nanochat's split: the last shard is "val", all others "train"."""
    files = list_parquet_files(data_dir)
    if split not in ("train", "val"):
        raise ConfigError(f"split {split!r}: expected 'train' or 'val'")
    if len(files) < 2:
        raise SourceError(f"{data_dir}: {len(files)} Parquet shard(s); the train/val split needs at least 2 "
                          "(the last one is val): download more shards")
    return files[:-1] if split == "train" else files[-1:]


class RankDocuments:
    """The documents of one rank as a numbered, re-readable, infinite stream of token arrays."""

    def __init__(self, files, tokenizer, *, rank: int, world_size: int, text_column: str = TEXT_COLUMN,
                 bos_id: int | None = None, batch_size: int = TOKENIZER_BATCH_SIZE, threads: int | None = None):
        if not files or any(is_url(f) for f in files):
            raise ConfigError(f"Parquet files {list(files)[:3]}: expected local files (`download` fetches shards from a URL)")
        self.files = [Path(f) for f in files]
        self.tokenizer, self.text_column = tokenizer, text_column
        self.bos = tokenizer.bos_id if bos_id is None else bos_id
        if self.bos is None:
            raise ConfigError(f"tokenizer {tokenizer.model_path} has no BOS token; pass bos_id=")
        if threads is not None and threads < 1:
            raise ConfigError(f"tokenizer_threads={threads}: must be >= 1 (or None: the rank's share of the cores)")
        self.batch_size = count("ParquetTokenLoader", "tokenizer_batch_size", batch_size, what="a batch size")
        self.threads = rank_threads() if threads is None else threads
        self.tokens_encoded = 0  # every token tokenized, including look-ahead and re-reads on resume
        self._pf: OrderedDict[int, object] = OrderedDict()  # the files open now, least recently read first
        groups = []
        for fi, path in enumerate(self.files):
            # NOTE: each footer is read once and the file closed: thousands of shards never hold
            # thousands of descriptors (the default limit is 1,024)
            md = _read_metadata(path)
            names = md.schema.to_arrow_schema().names
            if text_column not in names:
                raise SourceError(f"{path}: no column {text_column!r} (columns: {names}); pass text_column=")
            groups += [(fi, g, md.row_group(g).num_rows) for g in range(md.num_row_groups)]
        if len(groups) < world_size:
            raise ConfigError(f"{len(groups)} row groups in {len(self.files)} file(s) for world_size {world_size}: "
                              "some ranks would get no data; use more shards or fewer ranks")
        self.groups = groups[rank::world_size]
        self.cumulative = np.concatenate([[0], np.cumsum([n for _, _, n in self.groups])]).astype(np.int64).tolist()
        self.docs_per_epoch = self.cumulative[-1]
        if self.docs_per_epoch == 0:
            raise SourceError(f"rank {rank}: its row groups hold no rows; the shards are empty")
        # per-file names and sizes, so a state from other files is refused
        self.fingerprint = fingerprint("parquet", [[p.name, p.stat().st_size] for p in self.files],
                                       text_column, tokenizer.sha256, self.bos)

    def _open(self, fi: int):
        """File `fi`, open; at most OPEN_FILES stay open (a rank reads its groups file after file)."""
        import pyarrow.parquet as pq

        if fi in self._pf:
            self._pf.move_to_end(fi)
            return self._pf[fi]
        while len(self._pf) >= OPEN_FILES:
            self._pf.popitem(last=False)[1].close()
        self._pf[fi] = pq.ParquetFile(self.files[fi])
        return self._pf[fi]

    def close(self) -> None:
        while self._pf:
            self._pf.popitem()[1].close()

    def locate(self, doc_id: int) -> tuple[int, int]:
        """doc id -> (position in this rank's group list, row in that group)."""
        k = doc_id % self.docs_per_epoch
        pos = bisect.bisect_right(self.cumulative, k) - 1
        return pos, k - self.cumulative[pos]

    def texts(self, pos: int) -> list[str]:
        fi, g, _ = self.groups[pos]
        texts = self._open(fi).read_row_group(g, columns=[self.text_column]).column(0).to_pylist()
        if None in texts:
            raise SourceError(f"{self.files[fi]}: row group {g}, row {texts.index(None)}: null {self.text_column!r}; "
                              "filter null rows out of the shard")
        return texts

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        out = []
        for ids in encode_whole(self.tokenizer, texts, self.threads):
            arr = np.empty(len(ids) + 1, dtype=np.int64)
            arr[0] = self.bos
            arr[1:] = ids
            out.append(arr)
            self.tokens_encoded += len(arr)
        return out

    def stream(self, start: int):
        """Yield (doc id, tokens) from doc id `start` on, forever (epochs wrap)."""
        doc_id = start
        pos, row = self.locate(start)
        while True:
            texts = self.texts(pos)[row:]
            for i in range(0, len(texts), self.batch_size):
                for tokens in self.encode(texts[i:i + self.batch_size]):
                    yield doc_id, tokens
                    doc_id += 1
            pos, row = (pos + 1) % len(self.groups), 0

    def fetch(self, doc_ids: list[int]) -> dict[int, np.ndarray]:
        """Tokens of given doc ids (for restoring a buffer): reads each needed row group once."""
        by_group: dict[int, list[tuple[int, int]]] = {}
        for d in doc_ids:
            pos, row = self.locate(d)
            by_group.setdefault(pos, []).append((d, row))
        out = {}
        for pos, wanted in by_group.items():
            texts = self.texts(pos)
            out.update(zip([d for d, _ in wanted], self.encode([texts[row] for _, row in wanted]), strict=True))
        return out


class ParquetTokenLoader:
    """`for x, y in ParquetTokenLoader(files, tok, B, T)`: int64 (B, T) batches, forever."""

    def __init__(self, files, tokenizer, B: int, T: int, *, packing: str = "bestfit", rank: int | None = None,
                 world_size: int | None = None, buffer_size: int = BUFFER_SIZE,
                 tokenizer_batch_size: int = TOKENIZER_BATCH_SIZE, tokenizer_threads: int | None = None,
                 text_column: str = TEXT_COLUMN, bos_id: int | None = None, device: str | torch.device = "cpu",
                 prefetch: int = PREFETCH, prefetch_mode: str = "auto"):
        if packing not in PACKINGS:
            raise ConfigError(f"packing {packing!r}: expected one of {PACKINGS}")
        B, T = count("ParquetTokenLoader", "B", B, what="a batch size"), count("ParquetTokenLoader", "T", T, what="a window length")
        buffer_size = count("ParquetTokenLoader", "buffer_size", buffer_size, what="a buffer size")
        if prefetch < 0:
            raise ConfigError(f"prefetch {prefetch}: batches to prepare ahead must be >= 0 (0: none)")
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.B, self.T, self.packing, self.buffer_size = B, T, packing, buffer_size
        self.device = torch.device(device)
        self.docs = RankDocuments(files, tokenizer, rank=self.rank, world_size=self.world_size,
                                  text_column=text_column, bos_id=bos_id, batch_size=tokenizer_batch_size,
                                  threads=tokenizer_threads)
        self.batches = 0
        self._restart(next_doc=0, offset=0, buffer=[])
        self._ahead = None
        self._delivered = self.state_now()
        self._stats, self._closed = {}, False
        if prefetch:
            mode = resolve_mode(prefetch_mode, tokenizer)
            # a worker process builds its own loader from these (the tokenizer pickles as its path)
            spec = (ParquetTokenLoader, (list(self.docs.files), tokenizer, B, T),
                    {"packing": packing, "rank": self.rank, "world_size": self.world_size,
                     "buffer_size": buffer_size, "tokenizer_batch_size": tokenizer_batch_size,
                     "tokenizer_threads": tokenizer_threads, "text_column": text_column, "bos_id": self.docs.bos})
            self._ahead = Prefetcher(depth=prefetch, mode=mode, make_iter=self._made, spec=spec)

    def _restart(self, *, next_doc: int, offset: int, buffer: list[int]) -> None:
        self._stream = self.docs.stream(next_doc)
        self._next_doc = next_doc
        self._held: deque[tuple[int, np.ndarray]] = deque()
        self._offset = offset
        self.packer = BestFitPacker(self._pull, self.buffer_size)
        for d, tokens in sorted(self.docs.fetch(buffer).items()):
            self.packer.add(d, tokens)

    def _pull(self) -> tuple[int, np.ndarray]:
        doc_id, tokens = next(self._stream)
        self._next_doc = doc_id + 1
        return doc_id, tokens

    def __iter__(self):
        return self

    def _contiguous(self) -> np.ndarray:
        need = self.B * self.T + 1
        buf = np.empty(need, dtype=np.int64)
        got, i, off = 0, 0, self._offset
        while got < need:
            if i == len(self._held):
                self._held.append(self._pull())
            tokens = self._held[i][1][off:]
            n = min(len(tokens), need - got)
            buf[got:got + n] = tokens[:n]
            got, i, off = got + n, i + 1, 0
        # advance by B*T, not B*T+1: the last token is the first input of the next batch
        self._offset += self.B * self.T
        while self._held and self._offset >= len(self._held[0][1]):
            self._offset -= len(self._held.popleft()[1])
        return buf

    def produce(self) -> tuple[np.ndarray, dict]:
        """The next batch's tokens (contiguous: B*T+1 of the stream; bestfit: (B, T+1) rows), half the bytes
        of x and y for the queue and the copies, and the packing figures."""
        if self.packing == "contiguous":
            tokens = self._contiguous()
        else:
            tokens = np.empty((self.B, self.T + 1), dtype=np.int64)
            for r in range(self.B):
                self.packer.fill_row(tokens[r])
        return tokens, self._own_stats()

    def host_batch(self, tokens: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) int64 (B, T) host tensors of produce()'s tokens; pinned when the loader feeds CUDA."""
        pin = self.device.type == "cuda"
        t = torch.from_numpy(tokens)
        if t.ndim == 1:
            t = t.pin_memory() if pin else t
            return t[:-1].view(self.B, self.T), t[1:].view(self.B, self.T)
        # NOTE: copies, not views: a (B, T) slice of (B, T+1) rows is not contiguous, and models call
        # targets.view(-1)
        x = torch.empty((self.B, self.T), dtype=torch.int64, pin_memory=pin).copy_(t[:, :-1])
        y = torch.empty((self.B, self.T), dtype=torch.int64, pin_memory=pin).copy_(t[:, 1:])
        return x, y

    def _made(self):
        """A thread prefetcher's items: the host batch is made in the background too, each with the state
        right after it."""
        while True:
            tokens, stats = self.produce()
            yield (self.host_batch(tokens), stats), self.state_now()

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._closed:
            self.load_state_dict(self.state_dict())
        if self._ahead is None:
            tokens, self._stats = self.produce()
            x, y = self.host_batch(tokens)
            self._delivered = None  # computed when asked: the loader's own position is the delivered one
        elif self._ahead.mode == "thread":
            ((x, y), self._stats), self._delivered = self._ahead.get()
        else:  # a worker process sends the tokens alone: half the bytes through the pipe
            (tokens, self._stats), self._delivered = self._ahead.get()
            x, y = self.host_batch(tokens)
        self.batches += 1
        if self.device.type == "cuda":
            return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        return x, y

    def _own_stats(self) -> dict:
        # contiguous rows are the stream cut in order: every slot filled, nothing cropped (no packer runs)
        own = self.packer.stats() if self.packing != "contiguous" else {
            "tokens_cropped": 0, "crop_fraction": 0.0, "utilisation": 1.0}
        return {"packing": self.packing, "tokens_encoded": self.docs.tokens_encoded, **own}

    def stats(self) -> dict:
        """Packing figures up to the last batch delivered (or made, without prefetching)."""
        return {"batches": self.batches, **(self._stats or self._own_stats())}

    def close(self) -> None:
        """Stop the background producer, if any (a prefetching loader also stops when collected); a next() after
        it goes on after the last batch delivered."""
        if self._ahead is not None:
            self._ahead.stop()
            self._closed = True  # the batches made ahead are dropped: the next one starts from the delivered state
        self.docs.close()

    def state_now(self) -> dict:
        """The position after the last batch this loader's producer made."""
        state = {"kind": PARQUET_KIND, "version": STATE_VERSION, "fingerprint": self.docs.fingerprint,
                 "packing": self.packing, "rank": self.rank, "world_size": self.world_size,
                 "buffer_size": self.buffer_size}
        if self.packing == "contiguous":
            doc = self._held[0][0] if self._held else self._next_doc
            return {**state, "next_doc": doc, "offset": self._offset}
        return {**state, "next_doc": self._next_doc, "buffer": self.packer.buffered_ids()}

    def state_dict(self) -> dict:
        """The position after the last batch delivered: prefetched batches are not part of it."""
        return self.state_now() if self._delivered is None else dict(self._delivered)

    def load_state_dict(self, state: dict) -> None:
        state = check_state(state, kind=PARQUET_KIND, fingerprint=self.docs.fingerprint,
                            fields=("packing", "rank", "world_size", "buffer_size", "next_doc"))
        mine = {"packing": self.packing, "rank": self.rank, "world_size": self.world_size,
                "buffer_size": self.buffer_size}
        theirs = {k: state[k] for k in mine}
        if theirs != mine:
            raise StateError(f"parquet loader state was written with {theirs}, this loader has {mine}: each rank "
                             "must load its own state with the same world size, packing and buffer size")
        next_doc = state_int(PARQUET_KIND, state, "next_doc")
        if self.packing == "contiguous":
            offset, buffer = state_int(PARQUET_KIND, {"offset": 0, **state}, "offset"), []
        else:
            offset, buffer = 0, state_ints(PARQUET_KIND, {"buffer": None, **state}, "buffer")
            if any(d >= next_doc for d in buffer):
                raise StateError(f"{PARQUET_KIND} state: buffer holds doc ids >= next_doc = {next_doc}; the "
                                 "state is hand-edited or corrupt, resume from the state_dict() the loader wrote")
        if self._ahead is not None:
            self._ahead.stop()  # NOTE: before the producer's loader is touched: the thread runs on it
        self._restart(next_doc=next_doc, offset=offset, buffer=buffer)
        self._delivered, self._closed = self.state_now(), False
        if self._ahead is not None:
            self._ahead.restart_at(self._delivered)
