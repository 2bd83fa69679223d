"""The mixture-of-experts block and its parts.

`sparse` holds `SparseMoE` (the block: a router, experts run once over the rows routed to
them, an optional shared expert) and `expert_bytes`; `router` the softmax top-k router;
`gpt_oss` gpt-oss's own router and clamped SwiGLU expert; `native` and `triton` the fused
methods `SparseMoE.prepare` picks where every expert took the native CPU library's or
Triton's quantized storage.
"""
