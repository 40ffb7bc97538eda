"""Training-time loading: samplers with exact resumption, mixtures, random-window streams, the streaming
Parquet path and bits-per-byte.

    sampler = GlobalBatchSampler(ds, global_batch_size=64, seed=0)     # rank/world from torch.distributed
    loader = ResumableDataLoader(ds, sampler, num_workers=2)
    state = loader.state_dict(); loader.load_state_dict(state)          # JSON-able, any world size
"""

from niels_gpt.lazy import lazy_names

# NOTE: the names below are imported on first use (PEP 562), not with the package: most of its modules
# import torch (~1.5 s), and `download` and the CLI's other verbs need none of it.
_HOMES = {
    "evaluate_bpb": "bpb", "token_bytes": "bpb",
    "MixtureConfig": "mixture", "MixtureDataset": "mixture", "MixtureSampler": "mixture", "Phase": "mixture",
    "ParquetTokenLoader": "parquet", "list_parquet_files": "parquet", "split_files": "parquet",
    "GlobalBatchSampler": "sampler", "ResumableDataLoader": "sampler",
    "epoch_order": "order", "epoch_permutation": "order", "global_batches": "order",
    "BatchSchedule": "schedule", "batch_ramp": "schedule",
    "ShardWindowSampler": "shard_windows",
    "RankBatchStream": "stream",
    "IndexedWindowDataset": "windows",
}
__all__ = sorted(_HOMES)
__getattr__, __dir__ = lazy_names(globals(), _HOMES)
