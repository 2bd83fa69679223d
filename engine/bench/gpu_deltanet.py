"""The device check's Gated DeltaNet step (scripts/gpu_check.py): one Qwen3.5-0.8B-shaped
linear layer's token mixing (the conv and the gated delta rule over the state pool),
Triton against the PyTorch path on the same inputs, and against fla-core's kernels where
that library is importable (the bundle's optional wheels): the measurement behind the
fla-core decision (docs/ARCHITECTURE.md, "Hybrid models").

- prefill: ``PREFILL_SEQS`` fresh sequences of ``PREFILL_TOKENS`` tokens in one step,
  a snapshot every ``SNAPSHOT_EVERY`` tokens as the engine takes them at block
  boundaries (the PyTorch path splits its chunks there, the Triton one does not);
- decode: one token for each of ``DECODE_BATCH`` sequences resuming their slots;
- agreement: the two paths' outputs and final states, max |diff| / max |torch's|;
- fla-core (prefill without snapshots, decode): its ``chunk_gated_delta_rule`` with
  ``cu_seqlens`` and ``fused_recurrent_gated_delta_rule`` on the conv's q, k, v, timed
  against our kernels alone on the same tensors (it has no pool slots: its states are
  gathered for it and scattered back, in its time), and its output's agreement.

``shape`` and the sizes are parameters so the suite runs it tiny on the CPU, where the
Triton kernels are interpreted.
"""

from __future__ import annotations

import importlib.util
import json
import time
from dataclasses import asdict, dataclass

import torch

from engine.layers import delta_rule
from engine.layers.gated_deltanet import DeltaNetShape, StateMetadata
from engine.layers.token_mixers import MixerInputs, TorchMixer, TritonMixer, split_heads

MARK = "@@gpu-deltanet@@ "
# Qwen3.5-0.8B's linear layers: 16 k and 16 v heads of 128, a conv of width 4.
QWEN35_08B = DeltaNetShape(hidden_size=1024, num_k_heads=16, num_v_heads=16, head_k_dim=128,
                           head_v_dim=128, conv_width=4, eps=1e-6)
PREFILL_SEQS, PREFILL_TOKENS, DECODE_BATCH = 4, 2048, 32
SNAPSHOT_EVERY = 16  # the engine's block size: a snapshot at every block boundary (k = 1)


@dataclass(slots=True)
class DeltaNetBench:
    device: str
    prefill_torch_s: float
    prefill_triton_s: float
    decode_torch_s: float
    decode_triton_s: float
    prefill_rel_err: float  # triton against torch: outputs and final states
    decode_rel_err: float
    fla: str  # "fla-core X.Y" or why it was not run
    prefill_kernel_s: float | None = None  # our kernels alone, no conv, no snapshots
    prefill_fla_s: float | None = None
    decode_kernel_s: float | None = None
    decode_fla_s: float | None = None
    fla_rel_err: float | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def _seconds(fn, reps: int, device: torch.device) -> float:
    """The median of ``reps`` timed calls, on CUDA after two warm-up calls (compiles,
    caches)."""
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(2 if cuda else 0):
        fn()
    times = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


class _Case:
    """One step's inputs over a pool of ``slots`` slots, fresh for each call."""

    def __init__(self, shape: DeltaNetShape, meta: StateMetadata, dtype: torch.dtype,
                 device: torch.device, seed: int) -> None:
        gen = torch.Generator(device=device).manual_seed(seed)
        rows, slots = meta.query_start_loc[-1], 1 + max(
            [*meta.slots, *(s for snaps in meta.snapshots or [] for _, s in snaps)])
        s = shape

        def rand(*size, scale=1.0):
            return scale * torch.randn(*size, generator=gen, device=device)

        self.shape, self.meta = shape, meta
        self.mixed = rand(rows, s.conv_dim).to(dtype)
        self.g = -torch.rand(rows, s.num_v_heads, generator=gen, device=device) * 0.3
        self.beta = torch.rand(rows, s.num_v_heads, generator=gen, device=device)
        self.weight = rand(s.conv_dim, s.conv_width, scale=0.5).to(dtype)
        self.conv0 = rand(slots, s.conv_dim, s.conv_width - 1).to(dtype)
        self.rec0 = rand(slots, s.num_v_heads, s.head_k_dim, s.head_v_dim, scale=0.1)

    def inputs(self) -> MixerInputs:
        return MixerInputs(self.mixed, self.g, self.beta, self.weight, self.conv0.clone(),
                           self.rec0.clone(), self.meta)


def _compare(case: _Case, reps: int, device: torch.device) -> tuple[float, float, float]:
    """(torch seconds, triton seconds, relative error of outputs and states)."""
    torch_mixer, triton_mixer = TorchMixer(), TritonMixer()
    results = []
    for mixer in (torch_mixer, triton_mixer):
        x = case.inputs()
        results.append((mixer(case.shape, x), x.rec_states, x.conv_states))
    err = max(_rel_err(got, want) for got, want in zip(results[1], results[0], strict=True))
    # Timed on one set of pools (fresh copies would add their own copying to each call):
    # prefill rows start from zeros, and repeated decode steps keep states bounded.
    x = case.inputs()
    times = [_seconds(lambda m=m: m(case.shape, x), reps, device)
             for m in (torch_mixer, triton_mixer)]
    return times[0], times[1], err


def run_deltanet_bench(device: str | torch.device = "cuda", shape: DeltaNetShape = QWEN35_08B,
                       seqs: int = PREFILL_SEQS, tokens: int = PREFILL_TOKENS,
                       batch: int = DECODE_BATCH, snapshot_every: int = SNAPSHOT_EVERY,
                       reps: int = 10, report=None) -> DeltaNetBench:
    """``report(result)``, when given, is called once our two paths are measured, before
    fla-core's first call (whose compiling and autotuning may outlast the step's limit),
    and again after it."""
    device = torch.device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    starts = [i * tokens for i in range(seqs + 1)]
    snapshots = [[(t, seqs + i * tokens // snapshot_every + j)
                  for j, t in enumerate(range(snapshot_every, tokens + 1, snapshot_every))]
                 for i in range(seqs)]
    prefill = _Case(shape, StateMetadata(starts, list(range(seqs)), [False] * seqs,
                                         snapshots), dtype, device, seed=1)
    decode = _Case(shape, StateMetadata(list(range(batch + 1)), list(range(batch)),
                                        [True] * batch), dtype, device, seed=2)
    p_torch, p_triton, p_err = _compare(prefill, reps, device)
    d_torch, d_triton, d_err = _compare(decode, reps, device)
    result = DeltaNetBench(str(device), p_torch, p_triton, d_torch, d_triton, p_err, d_err,
                           _fla_status())
    report = report or (lambda _: None)
    report(result)
    if result.fla.startswith("fla-core"):
        plain = _Case(shape, StateMetadata(starts, list(range(seqs)), [False] * seqs),
                      dtype, device, seed=1)
        try:
            _time_fla(result, plain, decode, reps, device)
        except Exception as exc:  # noqa: BLE001 - the row says why instead of failing the step
            result.fla += f" failed: {type(exc).__name__}: {str(exc)[:200]}"
        report(result)
    return result


def _fla_status() -> str:
    if importlib.util.find_spec("fla") is None:
        return "not installed"
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"fla-core {version('fla-core')}"
    except PackageNotFoundError:
        return "fla-core (unknown version)"


def _heads(case: _Case) -> tuple[torch.Tensor, ...]:
    """The conv's q, k, v of a case (each sequence from a zero conv state), contiguous."""
    meta, conv_out = case.meta, torch.empty_like(case.mixed)
    for r0, r1 in zip(meta.query_start_loc[:-1], meta.query_start_loc[1:], strict=True):
        window = delta_rule.conv_window(case.mixed[r0:r1], None, case.shape.conv_width)
        conv_out[r0:r1] = delta_rule.conv_of_window(window, case.weight)
    return tuple(t.contiguous() for t in split_heads(case.shape, conv_out))


def _time_fla(result: DeltaNetBench, prefill: _Case, decode: _Case, reps: int,
              device: torch.device) -> None:
    """fla-core's kernels against ours on the same q, k, v. fla takes and returns states
    as a [N, Hv, Dk, Dv] batch, not pool slots: the gather before and the scatter after
    are in its time, as they would be in the engine's."""
    from fla.ops.gated_delta_rule import (
        chunk_gated_delta_rule,
        fused_recurrent_gated_delta_rule,
    )

    from kernels.triton.delta_rule_chunk import chunk_layout, chunked_prefill
    from kernels.triton.delta_rule_decode import recurrent_step

    scale = prefill.shape.head_k_dim ** -0.5
    fla_args = dict(scale=scale, output_final_state=True, use_qk_l2norm_in_kernel=True)
    meta = prefill.meta
    q, k, v = _heads(prefill)
    g, beta, rec = prefill.g, prefill.beta, prefill.rec0.clone()
    slots = torch.tensor(meta.slots, device=device)
    layout = chunk_layout(list(zip(meta.query_start_loc[:-1], meta.query_start_loc[1:],
                                   strict=True)), meta.slots, meta.resumes, None, device)
    ours = torch.empty(v.shape, dtype=torch.float32, device=device)
    cu = torch.tensor(meta.query_start_loc, dtype=torch.long, device=device)

    def fla_prefill():
        out, final = chunk_gated_delta_rule(q[None], k[None], v[None], g[None], beta[None],
                                            cu_seqlens=cu, **fla_args)
        rec[slots] = final.float()
        return out[0]

    result.prefill_kernel_s = _seconds(
        lambda: chunked_prefill(q, k, v, g, beta, rec, layout, ours), reps, device)
    result.prefill_fla_s = _seconds(fla_prefill, reps, device)
    err = _rel_err(fla_prefill(), ours)
    dq, dk, dv = _heads(decode)
    d_rec = decode.rec0.clone()
    d_slots = torch.tensor(decode.meta.slots, device=device)
    d_ours = recurrent_step(dq, dk, dv, decode.g, decode.beta, d_rec.clone(), d_slots)

    def fla_decode():
        out, final = fused_recurrent_gated_delta_rule(
            dq[:, None], dk[:, None], dv[:, None], decode.g[:, None], decode.beta[:, None],
            initial_state=d_rec[d_slots], **fla_args)
        d_rec[d_slots] = final.float()
        return out[:, 0]

    result.decode_kernel_s = _seconds(
        lambda: recurrent_step(dq, dk, dv, decode.g, decode.beta, d_rec, d_slots), reps,
        device)
    result.decode_fla_s = _seconds(fla_decode, reps, device)
    d_rec.copy_(decode.rec0)
    result.fla_rel_err = max(err, _rel_err(fla_decode(), d_ours))
