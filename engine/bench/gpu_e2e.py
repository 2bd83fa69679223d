"""The device check's end-to-end step (scripts/gpu_check.py): a synthetic Llama-shaped
Q4_K_M model (synthetic.py, written from a vocabulary-only GGUF, so no starter has to
travel), loaded with the default config, then:

- the device and attention backend it picked (on a GPU: CUDA and Triton);
- the first step's logits of a ``PROMPT_TOKENS``-token prompt against the PyTorch
  attention backend's on the same weights and pool (the runner's backend swapped for
  one step), within ``LOGIT_TOLERANCE``;
- the prompt's time to first token and ``DECODE_TOKENS`` decode tokens, with CUDA graphs
  and without (the runner's graph runner set aside), batch 1;
- first-use compile: the first warm-up request's wall time (every kernel of the model
  compiled on first use, graphs captured) less the same request's once warm;
- peak device memory against the budget: weights, KV pool and the activation reserve.

``size`` "tiny" (``TINY``) runs on any device in seconds: the emulation of the lent
machine (scripts/device_emulation.sh) takes this path on its CPU.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine.bench.synthetic import SIZES, Shape, ensure_synthetic_gguf
from engine.config import EngineConfig
from engine.core.scheduler_output import ScheduledSeq, SchedulerOutput
from engine.core.sequence import Sequence
from engine.llm import LLM
from engine.runner.kv_cache import CUDA_RESERVE_BYTES
from engine.sampling_params import SamplingParams
from kernels.reference.backend import TorchBackend

PROMPT_TOKENS = 2048
DECODE_TOKENS = 128
# max |logits - torch backend's| / max |torch backend's|: bf16 keeps 8 bits of mantissa
# (2^-8 relative per rounding) and the two backends round their attention sums in
# different orders through every layer, so a few 2^-8 steps of the largest logit.
LOGIT_TOLERANCE = 2.0**-5
TINY = Shape(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512,
             context=4096)
MARK = "@@gpu-e2e@@ "


@dataclass(slots=True)
class E2EResult:
    size: str
    device: str
    backend: str
    write_s: float  # writing the synthetic file (0 when it was there)
    load_s: float
    compile_s: float
    ttft_s: float
    tok_s_graphs: float | None  # None: no graph runner (off CUDA)
    tok_s_eager: float
    logits_rel_err: float
    weights_bytes: int
    peak_bytes: int | None  # CUDA only
    budget_bytes: int
    peak_gbps: float | None  # the card's memory bandwidth (kernels/bench.py); CUDA only

    @property
    def bound_tok_s(self) -> float | None:
        """Batch-1 decode's ceiling: every weight byte read once a token."""
        return None if self.peak_gbps is None else self.peak_gbps * 1e9 / self.weights_bytes

    @property
    def logits_ok(self) -> bool:
        return self.logits_rel_err <= LOGIT_TOLERANCE

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"logits_ok": self.logits_ok,
                                          "bound_tok_s": self.bound_tok_s})


def shape_of(size: str) -> Shape:
    if size == "tiny":
        return TINY
    if size not in SIZES:
        raise ValueError(f"size must be 'tiny' or one of {sorted(SIZES)}, got {size!r}")
    return SIZES[size]


def prompt_ids(length: int, vocab: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (length,), generator=generator).tolist()


def first_step_logits(llm: LLM, prompt: list[int], backend=None) -> torch.Tensor:
    """The logits of the last prompt token from one prefill step in the pool's blocks
    1.. (the engine is idle: no sequence owns them), with ``backend`` for that step."""
    runner = llm.engine.runner
    size = runner.shape.block_size
    table = list(range(1, 1 + -(-len(prompt) // size)))
    seq = Sequence(-1, "gpu-e2e", 0, list(prompt), len(prompt))
    step = SchedulerOutput(scheduled=[ScheduledSeq(seq, len(prompt), [table])])
    usual = runner.backend
    if backend is not None:
        runner.attach_key_stages(backend)
    runner.backend = backend or usual
    try:
        logits = runner.execute(step)
    finally:
        runner.backend = usual
    return logits[0].float().cpu()


def timed_generate(llm: LLM, prompt: list[int], tokens: int) -> tuple[float, float]:
    """(time to first token, decode tok/s after it) of one greedy request."""
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    metrics = llm.generate([prompt], params)[0].metrics
    return metrics.ttft_s, metrics.decode_tok_s


def run_e2e(size: str, tokenizer_gguf: Path, root: Path, device: str | None = None
            ) -> E2EResult:
    shape = shape_of(size)
    start = time.perf_counter()
    path, written = ensure_synthetic_gguf(tokenizer_gguf, shape, root=root)
    write_s = time.perf_counter() - start if written else 0.0
    cuda = torch.cuda.is_available() and device in (None, "cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    # The default config but for the prefill budget: the whole prompt in one step, so
    # the first step's logits are the prompt's.
    llm = LLM(str(path), EngineConfig(device=device, max_num_batched_tokens=PROMPT_TOKENS,
                                      max_model_len=min(shape.context, 4 * PROMPT_TOKENS)))
    load_s = time.perf_counter() - start
    engine = llm.engine
    resolved = engine.resolved_device
    vocab = engine.hf_config.vocab_size
    prompt = prompt_ids(PROMPT_TOKENS, vocab)
    warm = prompt_ids(64, vocab, seed=1)
    first = time.perf_counter()
    logits = first_step_logits(llm, prompt)
    timed_generate(llm, warm, 16)
    cold = time.perf_counter() - first
    again = time.perf_counter()
    first_step_logits(llm, prompt)
    timed_generate(llm, warm, 16)
    compile_s = max(0.0, cold - (time.perf_counter() - again))
    ttft, tok_s = timed_generate(llm, prompt, DECODE_TOKENS)
    graphs, tok_s_graphs = engine.runner.graphs, None
    if graphs is not None:
        tok_s_graphs = tok_s
        engine.runner.graphs = None
        try:
            _, tok_s = timed_generate(llm, prompt_ids(PROMPT_TOKENS, vocab, 2), DECODE_TOKENS)
        finally:
            engine.runner.graphs = graphs
    peak = torch.cuda.max_memory_allocated() if cuda else None
    gbps = None
    if cuda:
        from kernels.bench import peak_bandwidth_gbps

        gbps = peak_bandwidth_gbps(torch.device("cuda"))[0]
    reference = first_step_logits(llm, prompt, TorchBackend())
    rel = float((logits - reference).abs().max() / reference.abs().max().clamp_min(1e-6))
    budget = engine.weights_bytes + engine.runner.kv_pool_bytes + (
        CUDA_RESERVE_BYTES if cuda else 0)
    return E2EResult(size, str(resolved.device), resolved.backend, write_s, load_s, compile_s,
                     ttft, tok_s_graphs, tok_s, rel, engine.weights_bytes, peak, budget, gbps)
