"""One decode step of a starter-shaped model (SmolLM2-135M: 30 layers, hidden 576, 9 query
and 3 KV heads, random weights) on the CPU: the aten ops it dispatches and its time.

    python scripts/cpu_decode_step.py --native 1   # fused ops + the "cpu" backend
    python scripts/cpu_decode_step.py --native 0   # the PyTorch path (FOLIO_NATIVE_CPU=0)

--native is read before kernels is imported (the library's load is decided once).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--native", choices=("0", "1"), default="1")
    parser.add_argument("--context", type=int, default=512, help="tokens before the step")
    parser.add_argument("--batch", type=int, default=1, help="sequences decoding together")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=30)
    args = parser.parse_args()
    os.environ["FOLIO_NATIVE_CPU"] = args.native

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import LlamaConfig

    from engine.models import build_model
    from engine.models.base import pool_layers
    from kernels import AttentionMetadata, allocate_kv_cache, get_backend

    class CountOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: Counter[str] = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    torch.set_num_threads(args.threads)
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=args.layers, num_attention_heads=9,
                         num_key_value_heads=3, max_position_embeddings=8192,
                         rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True)
    model = build_model(config, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(0)
    weights = []
    for name, target in model.checkpoint_targets().items():
        noise = torch.randn(tuple(target.shape), generator=gen) * 0.02
        weights.append((name, noise + 1 if name.endswith("norm.weight") else noise))
    model.load_weights(weights)
    backend = get_backend("cpu", "cpu" if args.native == "1" else "torch")
    block_size, max_len = 16, args.context + args.steps + 8
    blocks_per_seq = -(-max_len // block_size)
    kv = allocate_kv_cache(args.layers, blocks_per_seq * args.batch, block_size, 3, 64,
                           torch.float32, "cpu", head_major=backend.head_major_kv)
    tables = torch.arange(blocks_per_seq * args.batch, dtype=torch.int32).view(args.batch, -1)

    def step(lengths_before: int, q_len: int):
        """Metadata, ids and positions of every sequence adding q_len tokens."""
        seq_len = lengths_before + q_len
        positions = torch.arange(lengths_before, seq_len).repeat(args.batch)
        slots = (tables.long()[:, positions[:q_len] // block_size] * block_size
                 + positions[:q_len] % block_size).flatten()
        meta = AttentionMetadata(
            query_start_loc=torch.arange(0, args.batch + 1, dtype=torch.int32) * q_len,
            seq_lens=torch.full((args.batch,), seq_len, dtype=torch.int32),
            block_tables=tables, slot_mapping=slots, max_query_len=q_len, max_seq_len=seq_len)
        ids = torch.randint(0, 49152, (args.batch * q_len,), generator=gen)
        return ids, positions, meta

    def forward(ids, positions, meta):
        hidden = model(ids, positions, pool_layers(kv, meta), meta, backend)
        rows = meta.query_start_loc[1:].long() - 1
        return model.compute_logits(hidden[rows])

    with torch.inference_mode():
        forward(*step(0, args.context))
        length = args.context
        times = []
        for _ in range(args.steps):
            inputs = step(length, 1)
            start = time.perf_counter()
            forward(*inputs)
            times.append(time.perf_counter() - start)
            length += 1
        counter = CountOps()
        with counter:
            forward(*step(length, 1))
    print(f"native={args.native} backend={backend.name} layers={args.layers} "
          f"batch={args.batch} context={args.context} threads={args.threads}")
    print(f"aten ops per decode step: {sum(counter.ops.values())} "
          f"({sum(counter.ops.values()) / args.layers:.1f} per layer)")
    print("  most frequent: " + ", ".join(f"{k} {v}" for k, v in counter.ops.most_common(12)))
    print(f"decode step: median {statistics.median(times) * 1e3:.2f} ms, "
          f"min {min(times) * 1e3:.2f} ms over {args.steps}")


if __name__ == "__main__":
    main()
