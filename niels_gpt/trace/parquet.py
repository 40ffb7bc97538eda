"""Parquet text shards: their micro-batches, replayed by the rank's own loader from the state before them.

A rank's documents are a numbered stream (epochs wrapping); bestfit rows report each placement through
`BestFitPacker.on_place`, contiguous rows are walked with the documents' token counts. The cost grows with
the distance from the checkpoint (every document in between is tokenized again).
"""

from __future__ import annotations

import numpy as np


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
