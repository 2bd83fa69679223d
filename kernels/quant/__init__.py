"""GGUF quantized weights: the block formats, and matrix products that read the blocks.

`formats` is the one table of the block types Folio keeps quantized (the loaders, the
layers and the kernels read it); the Triton kernels live in `kernels.triton`.
"""
