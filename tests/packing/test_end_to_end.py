"""Text -> SFT cache (the real builder) -> pack -> reader -> decode, on hand-written and real chats."""

from pathlib import Path

import numpy as np
import pytest

from niels_gpt.cache.build_cache import build_sft_cache
from niels_gpt.packing import collate_packed, open_packed, pack_sft

from ..conftest import SHARED_DATA, needs_shared

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "Paris is the capital of France."}],
    [{"role": "system", "content": "Answer briefly."},
     {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "Another one?"},
     {"role": "assistant", "content": "Green, like grass."}],
    [{"role": "user", "content": "Count to three."},
     {"role": "assistant", "content": "One, two, three."}],
]


def _answers(conversations):
    return sorted(m["content"] for c in conversations for m in c if m["role"] == "assistant")


def _decoded_targets(ds, tokenizer):
    """Decode, per packed sequence, each maximal run of trained targets (minus the closing EOT)."""
    eot = tokenizer.eot_id
    out = []
    for i in range(len(ds)):
        it = ds[i]
        ids, mask, b = it["input_ids"], it["loss_mask"].astype(bool), it["seq_boundaries"]
        for s, e in zip(b[:-1], b[1:], strict=True):
            targets = np.flatnonzero(mask[s:e]) + s + 1  # loss_mask[j] trains input_ids[j+1]
            assert (targets < e).all()
            runs = np.split(targets, np.flatnonzero(np.diff(targets) > 1) + 1)
            for run in runs:
                if len(run):
                    assert ids[run[-1]] == eot  # every trained span ends with its EOT
                    out.append(tokenizer.decode(ids[run[:-1]].tolist()))
    return sorted(out)


def test_text_to_cache_to_pack_to_decoded_answers(tmp_path, tokenizer):
    build_sft_cache(CONVERSATIONS * 4, str(tmp_path / "sft"), tokenizer=tokenizer, val_frac=0.0, seed=0)
    m = pack_sft(tmp_path / "sft", tmp_path / "packed", pack_size=64, algorithm="bfd")
    ds = open_packed(tmp_path / "packed")
    ds.validate()
    assert m["num_sequences"] == 12 and m["truncated"] == 0
    assert _decoded_targets(ds, tokenizer) == _answers(CONVERSATIONS * 4)
    batch = collate_packed([ds[i] for i in range(len(ds))], pad_to=64)
    assert batch["input_ids"].shape == (len(ds), 64)
    answer_ids = [t for t in batch["labels"].reshape(-1).tolist() if t != -100]
    assert answer_ids.count(tokenizer.eot_id) == 16  # one closing EOT per assistant turn


@needs_shared
@pytest.mark.real_data
def test_real_dolly_packs_every_answer(tmp_path, tokenizer):
    from niels_gpt.sources.corpus import corpus

    files = sorted(Path(SHARED_DATA, "dolly-15k").glob("*.jsonl"))
    convs = list(corpus(files, layout="dolly", chat=True).iter_conversations())
    build_sft_cache(convs, str(tmp_path / "sft"), tokenizer=tokenizer, val_frac=0.0, seed=0)
    m = pack_sft(tmp_path / "sft", tmp_path / "packed", pack_size=4096, algorithm="ffd")
    ds = open_packed(tmp_path / "packed")
    ds.validate()
    assert m["num_sequences"] == len(convs) and m["truncated"] == 0
    assert _decoded_targets(ds, tokenizer) == _answers(convs)
