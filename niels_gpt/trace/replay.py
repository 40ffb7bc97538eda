"""The samples of one micro-batch of a run, computed from the order (a pure function of seed and position),
not by running the loader; the loaders are opened as the trainer opens them.

| kind | sample | micro-batch k of a rank |
|---|---|---|
| indexed, shards, packed | window / bin index | the global sampler's position after k batches (`advance`) |
| windows, sft | (shard, start) / example index | the stream's draws of step k |
| mixture | (dataset, window) | the mixture sampler's state advanced k batches |
| parquet | the rank's documents in a row | the rank's loader from its state (`parquet_sequences`) |

Parquet text shards: a rank's documents are a numbered stream (epochs wrapping); bestfit rows report each
placement through `BestFitPacker.on_place`, contiguous rows are walked with the documents' token counts. The
cost grows with the distance from the checkpoint (every document in between is tokenized again).
"""

from __future__ import annotations

import numpy as np
import torch

from niels_gpt.loading.schedule import BatchSchedule
from niels_gpt.tokenizer import load_tokenizer
from niels_gpt.train.data import open_data
from niels_gpt.train.setup import WORLD_FREE


def advance(schedule: BatchSchedule, n: int, position: tuple[int, int, int], k: int) -> tuple[int, int, int]:
    """The global sampler's (epoch, consumed, total) after k more batches, in O(ramp steps) not O(k).

    Worked example: n=10 samples, G=4 (2 batches an epoch, the tail of 2 dropped), from (0, 4, 4), k=3:
    1 batch left in epoch 0, then 2 more: epoch 1 + 2 // 2 = 2, consumed 0, total 16."""
    e, c, t = schedule.position(n, *position)
    while k and schedule.steps[-1][0] > t:  # on the ramp: a batch at a time
        e, c, t = schedule.after(n, (e, c, t))
        k -= 1
    if k:
        g = schedule.at(t)
        per_epoch, left = n // g, (n - c) // g
        if k < left:
            c += k * g
        else:
            rest = k - left
            e, c = e + 1 + rest // per_epoch, rest % per_epoch * g
        t += k * g
    return e, c, t


class Replay:
    """The loader of one run segment (its settings, `world_size` ranks), asked for micro-batch k."""

    def __init__(self, data: str, config: dict, world_size: int, vocab_size: int | None):
        self.world_size = world_size
        self.T = int(config["sequence_len"])
        # Parquet text shards are tokenized with the run's tokenizer
        tokenizer = load_tokenizer(config["tokenizer"]) if config.get("tokenizer") else None
        self.opened = [open_data(config, data, rank=r, world=world_size, device="cpu", tokenizer=tokenizer,
                                 vocab_size=vocab_size or 1 << 30) for r in range(world_size)]
        self.kind = self.opened[0].kind
        self.data = data
        self._perms: dict[int, object] = {}
        source = self.opened[0].source
        if self.kind in WORLD_FREE:  # one global batch sampler
            self.sampler, self.dataset = source.loader.batch_sampler, source.loader.dataset
        elif self.kind == "parquet":  # a stream per rank, replayed by its own loader (`parquet_sequences`)
            self.sampler, self.dataset = source.docs, None
            self.fresh = [d.source.state_now() for d in self.opened]
        else:
            self.sampler, self.dataset = source, source.dataset

    # -- the order ---------------------------------------------------------------------------------
    def start(self, state: dict | None):
        """The position the replay counts micro-batches from: a checkpoint's loader state, or step 0."""
        loader = None if state is None else state["loader"]
        if self.kind in ("indexed", "shards", "packed"):
            if loader is None:
                return (0, 0, 0)
            self.sampler.seed = int(loader["seed"])
            total = loader.get("samples_total")
            if total is None:
                total = int(loader["epoch"]) * self.sampler.usable + int(loader["samples_consumed"])
            return int(loader["epoch"]), int(loader["samples_consumed"]), int(total)
        if self.kind == "mixture":
            s = self.sampler
            if loader is None:
                return 0, [0] * len(s.drawn), [0.0] * len(s.carry)
            s.seed = int(loader["seed"])
            return int(loader["step"]), list(loader["drawn"]), list(loader["carry"])
        if loader is not None:
            self.sampler.seed = int(loader["seed"])
        return 0 if loader is None else int(loader["step"])

    def order_at(self, state: dict) -> dict | None:
        """The order record (loaders' `order_at`) this replay gives at a checkpoint's rank `state`; None for
        Parquet shards, whose states record none."""
        if self.kind == "parquet":
            return None
        start = self.start(state)
        if self.kind in ("indexed", "shards", "packed"):
            return self.sampler.order_at(*start)
        return self.sampler.order_at(start[1] if self.kind == "mixture" else start)

    def _order(self, epoch: int):
        if epoch not in self._perms:
            if len(self._perms) > 2:
                self._perms.pop(next(iter(self._perms)))
            self._perms[epoch] = self.sampler.permutation(epoch)
        return self._perms[epoch]

    def samples(self, start, k: int, rank: int) -> list:
        """Rank `rank`'s sample ids of the k-th micro-batch after `start`."""
        if self.kind in ("indexed", "shards", "packed"):
            e, c, t = advance(self.sampler.schedule, self.sampler.num_samples, start, k)
            per = self.sampler.schedule.at(t) // self.world_size
            return self._order(e).slice(c + rank * per, c + (rank + 1) * per).tolist()
        if self.kind == "mixture":
            s = self.sampler
            step, drawn, carry = start
            state = {"step": step, "drawn": drawn, "carry": carry}
            for _ in range(k):
                state = s.advance_state(state)
            batch, _, _ = s._draw(state["step"], state["drawn"], state["carry"])
            return batch[rank * s.batch_size:(rank + 1) * s.batch_size]
        stream = self.opened[rank].source
        stream.seed = self.sampler.seed
        out = []
        for g in stream.draw_generators(start + k):
            if self.kind == "sft":
                out += torch.randint(len(self.dataset.offsets), (stream.draw_rows,), generator=g).tolist()
            else:
                shard, local = self.dataset.sample_starts(stream.draw_rows, g)
                out += list(zip(shard.tolist(), local.tolist(), strict=True))
        return out


def parquet_origin(loader, doc_id: int) -> dict:
    docs = loader.docs
    pos, row = docs.locate(doc_id)
    fi, group, _ = docs.groups[pos]
    return {"cache": str(docs.files[fi].parent), "split": f"rank{loader.rank}", "document": int(doc_id),
            "input": str(docs.files[fi]), "row_group": int(group), "row": int(row),
            "epoch": int(doc_id // docs.docs_per_epoch)}


def _rows(loader, T: int) -> tuple[np.ndarray, list[list[tuple[int, int, int]]]]:
    """The next batch's (B, T+1) tokens and, per row, [(doc id, start, end)] of its documents."""
    B = loader.B
    placed: list[list[tuple[int, int, int]]] = [[] for _ in range(B)]
    if loader.packing == "bestfit":
        tokens = np.empty((B, T + 1), dtype=np.int64)
        for r in range(B):
            loader.packer.on_place = lambda d, pos, n, r=r: placed[r].append((int(d), pos, pos + n))
            try:
                loader.packer.fill_row(tokens[r])
            finally:
                loader.packer.on_place = None
        return tokens, placed
    state = loader.state_now()
    flat, _ = loader.produce()
    doc, offset, at = int(state["next_doc"]), int(state["offset"]), 0
    spans = []  # (doc id, first stream position, end) over the batch's B*T+1 tokens
    while at < len(flat):
        n = len(loader.docs.fetch([doc])[doc]) - offset
        spans.append((doc, at, min(at + n, len(flat))))
        at, doc, offset = at + n, doc + 1, 0
    rows = np.stack([flat[r * T:r * T + T + 1] for r in range(B)])
    for r in range(B):
        lo, hi = r * T, r * T + T
        placed[r] = [(d, max(a, lo) - lo, min(b, hi) - lo) for d, a, b in spans if a < hi and b > lo]
    return rows, placed


def parquet_sequences(replay, states: list, micro_batches: list[int], ranks: list[int]) -> list[dict]:
    """The sequences of `micro_batches` after the per-rank loader `states` (None: the start)."""
    out = []
    for rank in ranks:
        loader = replay.opened[rank].source
        loader.load_state_dict(states[rank]["loader"] if states is not None else replay.fresh[rank])
        done = 0
        for m, k in enumerate(micro_batches):
            for _ in range(k - done):
                loader.produce()
            tokens, placed = _rows(loader, replay.T)
            done = k + 1
            for row in range(loader.B):
                documents = []
                for d, a, b in placed[row]:
                    a, b = min(a, replay.T), min(b, replay.T)  # a row's last token is a target only
                    if a < b:
                        documents.append({**parquet_origin(loader, d), "sequence_tokens": [a, b],
                                          "trained_tokens": b - a})
                out.append({"rank": rank, "micro_batch": m, "row": row, "sample": [d for d, _, _ in placed[row]],
                            "input_ids": tokens[row, :replay.T].tolist(), "trained": [True] * replay.T,
                            "documents": documents})
    return out


def parquet_hits(replay, states, count: int, rank: int, doc_id: int):
    """(micro-batch, row) of the first `count` micro-batches after `states` whose rows hold `doc_id` on `rank`."""
    loader = replay.opened[rank].source
    loader.load_state_dict(states[rank]["loader"] if states is not None else replay.fresh[rank])
    for k in range(count):
        _, placed = _rows(loader, replay.T)
        for row, docs in enumerate(placed):
            if any(d == doc_id and a < replay.T for d, a, _ in docs):
                yield k, row
