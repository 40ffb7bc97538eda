"""Readers of the library's own caches: random pretraining windows (`pretrain`) and the indexed windows of
`niels_gpt.loading` over one window core (`windows_core`: a split's shards as one range, local, compressed or
remote), assistant-masked SFT rows (`sft`), the shard listing of a split (`shards`) and the memory maps they
share (`mmap`). The contract's `niels_gpt.cache.pretrain_dataset` / `sft_dataset` / `mmap` re-export these."""
