"""The PyTorch reference attention backend: the CPU backend where the native library is
not built, and the oracle of the Triton and native kernels.

`backend` holds `TorchBackend` and the reference ops; `step_plan` what a step's metadata
decides once for every layer; `block_reads` a sequence's blocks read out of the pool;
`shared_prefix` decode over the blocks that candidates of one prompt share.
"""
