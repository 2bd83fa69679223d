"""GGUF quantized weights: the block formats, and matrix products that read the blocks.

`formats` is the one table of the block types Folio keeps quantized (the loaders, the
layers and the kernels read it); `matrix` picks a matrix's layout per device;
`torch_packed` holds the CPU layouts for PyTorch's weight-only int4pack / int8pack ops
(where the native library is not built: its wrappers are `kernels.cpu.quant`); `mxfp4`
gpt-oss's MXFP4 blocks. The Triton kernels live in `kernels.triton`.
"""
