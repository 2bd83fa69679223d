"""Speculative decoding on a hybrid model: plain decode beside three speculating runs on a
Qwen3.5-shaped random model (12 layers: 9 Gated DeltaNet, 3 full attention; hidden size
1024, 16 linear heads of 128), the same prompt ids, greedy:

- the plain reply's own ids as the prediction (every draft right: what a verify step with
  a state per draft token costs when all is kept);
- a prediction wrong from its second token on (every draft rejected: the state goes back
  every time, and the draft length backs off to none);
- prompt lookup on a reply that repeats nothing (no drafts: the bookkeeping alone).

Random weights make a reply whose text does not tokenize back to its ids, so the
prediction is given as ids (``SamplingParams.prediction``).
Each figure is the best decode tok/s of --runs rounds; every run's tokens must equal the
plain reply's. The model is written once to --folder.

    .venv/bin/python scripts/bench_hybrid_speculation.py --threads 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _model(folder: Path) -> Path:
    from tests.engine.tiny_models import peaked_weights, save_tiny_model, tiny_qwen35_config

    if not (folder / "config.json").exists():
        config = tiny_qwen35_config(
            hidden_size=1024, intermediate_size=3584, num_hidden_layers=12,
            num_attention_heads=8, num_key_value_heads=2, head_dim=256,
            linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
            linear_value_head_dim=128)
        save_tiny_model(folder, config, init=peaked_weights)
    return folder


def _run(engine, prompt: list[int], params):
    """One request to the end: (token ids, decode tok/s, drafts, kept drafts)."""
    from tests.engine.engine_runs import run_to_end

    engine.add_request(prompt, params)
    out = run_to_end(engine)
    m = out.metrics
    return (out.outputs[0].token_ids, m.decode_tok_s, m.num_draft_tokens,
            m.num_accepted_draft_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/folio-qwen35-12l"))
    args = parser.parse_args()

    import torch

    from engine import LLM
    from engine.sampling_params import SamplingParams
    from tests.engine.tiny_models import random_prompt

    torch.set_num_threads(args.threads)
    folder = str(_model(args.folder))
    plain = LLM(folder, kv_cache_dtype="float32", num_threads=args.threads).engine
    lookup = LLM(folder, kv_cache_dtype="float32", num_threads=args.threads,
                 speculative="ngram").engine
    prompt = random_prompt(7, 200)

    def params(prediction: list[int] | None = None) -> SamplingParams:
        return SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True,
                              prediction=prediction)

    reply = _run(plain, prompt, params())[0]
    wrong = reply[:1] + [(t + 1) % 256 for t in reply[1:]]
    cases = {"plain": (plain, None), "exact prediction": (plain, reply),
             "wrong prediction": (plain, wrong),
             "prompt lookup, nothing repeats": (lookup, None)}
    best: dict[str, tuple[float, int, int]] = {}
    for _ in range(args.runs):
        for name, (engine, ids) in cases.items():
            tokens, rate, drafted, kept = _run(engine, prompt, params(ids))
            if tokens != reply:
                raise SystemExit(f"{name}: the reply differs from plain decode's")
            if rate > best.get(name, (0.0, 0, 0))[0]:
                best[name] = (rate, drafted, kept)
    base = best["plain"][0]
    for name, (rate, drafted, kept) in best.items():
        print(f"{name:32s} {rate:7.1f} tok/s  / plain {rate / base:5.2f}  "
              f"drafts kept {kept} of {drafted}")


if __name__ == "__main__":
    main()
