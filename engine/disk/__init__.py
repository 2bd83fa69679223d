"""The KV cache's disk tier: full blocks kept as files across restarts (`tier.py`'s
`DiskTier` owns it; `store.py` the files, `group.py` a KV group's view of them,
`reader.py` the background reads, `files.py` / `key.py` / `scan.py` what keeps them
private and whole). The bookkeeping the scheduler depends on stays in engine/core
(`tier_blocks.py`, `disk_loads.py`): no torch and no files there."""
