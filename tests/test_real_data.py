"""The cache contract on the real corpora in ../shared/data (skipped when it is absent)."""

import numpy as np
import pytest
import torch

from niels_gpt.builders.pretrain import SplitTexts
from niels_gpt.cache.build_cache import build_pretrain_cache, build_sft_cache
from niels_gpt.cache.meta import read_meta
from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.cache.sft_dataset import SFTExampleDataset, assistant_span_mask
from niels_gpt.tokenizer import TrainSettings, train_tokenizer

from .conftest import SHARED_DATA, needs_shared

pytestmark = [needs_shared, pytest.mark.real_data]


class Books:
    """build-all's gutenberg source on a directory: its seeded split by file, each split read by the input layer."""

    def __init__(self, directory):
        from niels_gpt.sources.named import inputs

        self.spec = inputs("gutenberg", {"gutenberg_dir": str(directory)}, seed=42)

    def iter_texts(self, split):
        from niels_gpt.sources.corpus import corpus

        return corpus(self.spec["sources" if split == "train" else "val_sources"], layout="gutenberg").iter_texts()


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    from niels_gpt.sources.corpus import corpus

    books = Books(SHARED_DATA / "gutenberg")
    wiki = corpus([SHARED_DATA / "wikitext/wikitext-2-raw.wiki.valid.raw"], layout="wikitext")
    root = tmp_path_factory.mktemp("real")
    train_text = list(wiki.iter_texts()) + [t[:200_000] for t in books.iter_texts("train")]
    tok = train_tokenizer(train_text, root / "tokenizer", settings=TrainSettings(vocab_size=8000))
    return {"root": root, "tok": tok, "books": books, "wiki": wiki}


def test_gutenberg_books_round_trip_through_the_cache(real):
    tok, books = real["tok"], real["books"]
    out = real["root"] / "gutenberg"
    build_pretrain_cache(SplitTexts(train=books.iter_texts("train"), val=books.iter_texts("val")), str(out),
                         tokenizer=tok, max_train_tokens=2**62, max_val_tokens=2**62, shard_bytes=1 << 20, seed=42,
                         shuffle_buffer=None, num_workers=2)
    meta = read_meta(str(out))
    assert meta["totals"]["train_documents"] + meta["totals"]["val_documents"] == 10
    assert meta["totals"]["train_tokens"] > 1_000_000 and len(meta["files"]) > 3
    for split in ("train", "val"):
        stream = np.concatenate([np.fromfile(out / rel, dtype="<u2") for rel in sorted(meta["files"]) if rel.startswith(split)])
        docs = np.split(stream, np.flatnonzero(stream == tok.eot_id)[:-1] + 1)
        assert [tok.decode(d[:-1].tolist()) for d in docs] == list(books.iter_texts(split))


def test_random_windows_decode_to_text_of_the_books(real):
    tok = real["tok"]
    text = "\n".join(real["books"].iter_texts("train"))
    ds = PretrainTokenStreamDataset(str(real["root"] / "gutenberg" / "train"), T=64, device="cpu")
    x, y = ds.get_batch(B=32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(y[:, :-1], x[:, 1:]) and int(x.max()) < len(tok)
    for row in x:
        if tok.eot_id in row.tolist():
            continue  # a window across two books
        assert tok.decode(row[1:-1].tolist()) in text


def test_oasst_trees_build_an_sft_cache_with_exact_spans(real):
    from niels_gpt.sources.corpus import corpus

    tok = real["tok"]
    trees = SHARED_DATA / "oasst1" / "oasst_pre_release.en_100_tree.jsonl"
    convs = list(corpus([trees], layout="oasst", chat=True).iter_conversations())
    out = real["root"] / "oasst1"
    build_sft_cache(convs, str(out), tokenizer=tok, val_frac=0.1, seed=42)
    meta = read_meta(str(out))
    assert meta["totals"]["train_examples"] + meta["totals"]["val_examples"] == len(convs) == 100
    ds = SFTExampleDataset(str(out / "train_tokens.bin"), str(out / "train_idx.npy"), T=4096, device="cpu",
                           eot_id=tok.eot_id)
    rendered = {tuple(tok.render_chat(c).ids): tok.render_chat(c).mask for c in convs}
    for i in range(len(ds)):
        ids = ds.example(i)
        assert assistant_span_mask(ids, tok.asst_id, tok.eot_id).tolist() == rendered[tuple(ids.tolist())]
