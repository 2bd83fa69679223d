"""What every ``folio bench`` workload shares: its settings, the models under test, the
deterministic inputs, targets, and Folio as a bench side (a step loop on its engine that
times each token, and chat turns through ``LLM.chat``).

Folio gets a fresh engine per workload, so no workload finds another's prompts in the prefix
cache; the transformers model carries no state between calls and is built once per run.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from engine.bench.baselines import Reply, build_transformers_model, llama_cpp_status
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.step_loop import StepReport

# Eight fixed user turns of about 60 tokens each (SmolLM2's tokenizer); a longer chat cycles
# through them again, each marked with its turn number so no two turns are the same text.
USER_TEXTS = (
    "I am planning a three day trip to Lisbon in late October with two friends. We like "
    "walking, old neighbourhoods, small restaurants and live music. Could you suggest how to "
    "split the days between the city centre and nearby towns, and what we should book ahead?",
    "Thanks. One of my friends uses a wheelchair, and some of the streets in Alfama are steep "
    "and paved with slippery stones. Which parts of the plan would you change, and are the "
    "trams and the metro a good way to get around for her?",
    "We also want to eat well without spending too much. What are typical dishes we should "
    "try, how much does a simple dinner with wine usually cost per person, and is it normal "
    "to leave a tip in small family restaurants there?",
    "The weather forecast says it might rain on the second day. Can you suggest indoor "
    "things to do that still feel local, like markets, small museums or tiled churches, and "
    "how long each of them usually takes to visit?",
    "I read that Sintra gets very crowded. If we go there, which palace should we pick if we "
    "only have time for one, what time should we arrive, and is it better to take the train "
    "or to join a small guided tour from the city?",
    "For the evenings we would love to hear fado. How do we find a place that is not only "
    "for tourists, should we reserve a table, and is it rude to talk or take photos while "
    "the musicians are playing their songs?",
    "On the last morning we have about four hours before our flight leaves at two in the "
    "afternoon. What could we still do near the airport or on the metro line, and how early "
    "should we leave for the airport to be safe?",
    "Finally, could you turn everything we discussed into a short day by day list with the "
    "main stops, the transport between them and one restaurant idea for each evening, so "
    "that I can share it with my friends in our group chat?",
)


@dataclass(slots=True)
class BenchSettings:
    """Sizes of every workload; the defaults are the issue's, tests shrink them."""

    model: str = "starter"
    threads: int | None = None  # None = torch's current thread count
    turns: int = 8
    chat_repeats: int = 3  # Folio's chat runs this often; each turn's TTFT is the median
    user_tokens: int = 60
    reply_tokens: int = 32
    candidate_prompt_tokens: int = 512
    candidate_tokens: int = 64
    candidate_ns: tuple[int, ...] = (1, 2, 4, 8)
    candidate_runs: int = 2  # candidates: Folio runs per n, each on a fresh prompt; the fastest
    decode_contexts: tuple[int, ...] = (128, 2048)
    decode_tokens: int = 32
    decode_rounds: int = 3  # each side decodes this many fresh prompts, taking turns
    concurrent_chats: int = 8
    reopen_tokens: int = 4000  # reopen: the chat's length before turn 13
    reopen_repeats: int = 3  # reopen: runs of each turn-13 TTFT; the median
    reopen_sizes: tuple[str, ...] = ("1b",)  # reopen: synthetic sizes after the model
    document_tokens: int = 2500  # documents: the 4-page PDF's tokens, read whole
    serve_clients: int = 16  # concurrent API clients (serve)
    serve_turns: int = 4  # turns of the API chat (serve)
    kv_blocks: int | None = None  # None = the engine's default KV budget
    weights: str = "stored"  # Folio's EngineConfig.weights: "stored" (quantized) or "float32"
    cpu_activation_bits: int = 16  # Folio's EngineConfig.cpu_activation_bits: 16 or 8
    memory_context: int = 8192  # memory: every side's context (n_ctx, max_model_len)
    memory_turns: int = 2  # memory: turns of the short chat before the peak is read
    eightb_prompt_tokens: int = 32  # 8b: the short context decoded after
    eightb_tokens: int = 8  # 8b: tokens decoded per round
    eightb_rounds: int = 2  # 8b: rounds, the sides taking turns to go first
    eightb_timeout_s: float = 900.0  # 8b: the probe's limit (the load and every round)
    sizes: tuple[str, ...] = ("1b", "3b", "8b")  # sizes: names in synthetic.SIZES
    sizes_prompt_tokens: int = 512  # sizes: turn 1's prompt
    sizes_tokens: int = 64  # sizes: greedy tokens per turn
    sizes_followup_tokens: int = 64  # sizes: new ids of the follow-up turn
    sizes_timeout_s: float = 900.0  # sizes: each worker's limit (load, warm-up, two turns)
    sizes_runs: int = 2  # sizes: fresh-process runs per side and size; best of them
    structured_rounds: int = 3  # structured: rounds of each measurement
    structured_tokens: int = 128  # structured: the constrained reply's cap (the rate needs no end)
    moe_runs: int = 2  # moe: fresh-process runs per side (the sizes_* turns); best of them
    models_second: str = "1b"  # models: the second model, a synthetic size ("" = the model again)
    models_repeats: int = 3  # models: runs of each hosting measurement; the median
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("turns", "chat_repeats", "user_tokens", "reply_tokens",
                     "candidate_prompt_tokens", "candidate_tokens", "candidate_runs",
                     "decode_tokens",
                     "decode_rounds", "concurrent_chats", "serve_clients", "serve_turns",
                     "memory_context", "memory_turns", "reopen_tokens", "reopen_repeats",
                     "document_tokens",
                     "eightb_prompt_tokens", "eightb_tokens", "eightb_rounds",
                     "sizes_prompt_tokens", "sizes_tokens", "sizes_followup_tokens",
                     "sizes_runs", "structured_rounds", "structured_tokens", "moe_runs",
                     "models_repeats"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("reply_tokens", "candidate_tokens", "decode_tokens", "eightb_tokens",
                     "sizes_tokens"):
            if getattr(self, name) < 2:
                raise ValueError(f"{name} must be >= 2 (a decode rate needs two tokens), "
                                 f"got {getattr(self, name)!r}")
        check_sizes(self.sizes)
        if self.reopen_sizes:
            check_sizes(self.reopen_sizes)
        if self.models_second:
            check_sizes((self.models_second,))
        if self.weights not in ("stored", "float32"):
            raise ValueError(f"weights must be 'stored' or 'float32', got {self.weights!r}")
        if self.cpu_activation_bits not in (8, 16):
            raise ValueError(f"cpu_activation_bits must be 8 or 16, got "
                             f"{self.cpu_activation_bits!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads!r}")
        if self.kv_blocks is not None and self.kv_blocks < 1:
            raise ValueError(f"kv_blocks must be >= 1, got {self.kv_blocks!r}")
        if not self.candidate_ns or any(n < 1 for n in self.candidate_ns):
            raise ValueError(f"candidate_ns must be integers >= 1, got {self.candidate_ns!r}")
        if not self.decode_contexts or any(c < 1 for c in self.decode_contexts):
            raise ValueError(f"decode_contexts must be integers >= 1, got "
                             f"{self.decode_contexts!r}")


def check_sizes(sizes) -> None:
    """Raise ValueError naming the first size that ``synthetic.SIZES`` does not know."""
    from engine.bench.synthetic import SIZES

    if not sizes:
        raise ValueError(f"sizes must name at least one of {', '.join(SIZES)}")
    for size in sizes:
        if size not in SIZES:
            raise ValueError(f"unknown size {size!r}: choose from {', '.join(SIZES)}")


@dataclass(slots=True)
class Target:
    name: str
    value: float
    limit: float
    op: str  # "<=" or ">="

    @property
    def met(self) -> bool:
        return self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    def as_dict(self) -> dict:
        return {**asdict(self), "met": self.met}


@dataclass(slots=True)
class BenchContext:
    """The models of one ``folio bench`` run. Build with ``BenchContext.create``."""

    settings: BenchSettings
    model_path: Path
    threads: int
    _hf_model: torch.nn.Module | None = field(default=None, repr=False)

    @classmethod
    def create(cls, settings: BenchSettings) -> BenchContext:
        from engine.loaders.catalog import resolve_model

        threads = settings.threads or torch.get_num_threads()
        # Both sides run in this process: one setting gives both the same thread count.
        torch.set_num_threads(threads)
        return cls(settings, resolve_model(settings.model), threads)

    def new_llm(self):
        """A fresh Folio engine: empty prefix cache, same threads, device and compute dtype as
        transformers; its weights and activation bits as ``settings`` says."""
        from engine.llm import LLM

        s = self.settings
        return LLM(str(self.model_path), folio_config(
            self.threads, s.weights, num_gpu_blocks=s.kv_blocks,
            cpu_activation_bits=s.cpu_activation_bits))

    @property
    def hf_model(self) -> torch.nn.Module:
        if self._hf_model is None:
            from engine.loaders import load_model_files

            self._hf_model = build_transformers_model(load_model_files(self.model_path))
        return self._hf_model

    def llama_cpp_note(self) -> str | None:
        return llama_cpp_status(self.model_path)

    def describe(self) -> dict:
        return {"model": str(self.model_path), "threads": self.threads, "dtype": "float32",
                "weights": self.settings.weights,
                "cpu_activation_bits": self.settings.cpu_activation_bits,
                "torch": torch.__version__}


def folio_config(threads: int, weights: str, **overrides):
    """Folio's EngineConfig for a bench side: the CPU (the other sides run there, on the same
    threads) and float32 compute, whatever the machine's default device is."""
    from engine.config import EngineConfig

    return EngineConfig(num_threads=threads, dtype="float32", device="cpu", weights=weights,
                        **overrides)


def user_messages(tokenizer, turns: int, max_tokens: int) -> list[str]:
    """The fixed user turns, each cut to at most ``max_tokens`` tokens."""
    texts = []
    for turn in range(turns):
        text = USER_TEXTS[turn % len(USER_TEXTS)]
        if turn >= len(USER_TEXTS):
            text = f"Turn {turn + 1}: {text}"
        ids = tokenizer.encode(text, add_special_tokens=False)
        texts.append(tokenizer.decode(ids[:max_tokens]) if len(ids) > max_tokens else text)
    return texts


def filler_prompt(tokenizer, length: int, tag: str) -> list[int]:
    """``length`` token ids of plain text that start with ``tag``: a distinct tag per run
    keeps a run from finding an earlier run's prompt in Folio's prefix cache."""
    ids = tokenizer.encode(f"{tag}. " + " ".join(USER_TEXTS), add_special_tokens=False)
    body = tokenizer.encode(" " + " ".join(USER_TEXTS), add_special_tokens=False)
    while len(ids) < length:
        ids += body
    return ids[:length]


@dataclass(slots=True)
class FolioRun:
    output: RequestOutput
    token_times: list[float]  # perf_counter after each step that produced tokens
    start: float
    peak_used_blocks: int


def run_folio(llm, prompt, params, sample_kv: bool = False) -> FolioRun:
    """Run one request on an idle ``LLM`` to the end, noting (through the step loop's
    per-step hook) when tokens appear and, with ``sample_kv``, the peak of KV blocks in
    use after each step."""
    times: list[float] = []
    peak = 0

    def observe(report: StepReport) -> None:
        nonlocal peak
        if report.new_tokens:
            times.append(report.time)
        if sample_kv:
            peak = max(peak, llm.kv_stats(with_blocks=False).num_used)

    start = time.perf_counter()
    remove = llm.loop.add_hook(observe)
    try:
        output = llm.loop.run([prompt], params)[0]
    finally:
        remove()
    return FolioRun(output, times, start, peak)


class FolioChat:
    """Folio through ``LLM.chat``; each assistant message carries its token ids, so the
    earlier turns are found in the prefix cache. Optionally samples KV waste each step."""

    label = "Folio"

    def __init__(self, llm, reply_tokens: int, sample_waste: bool = False,
                 track_kv: bool = False) -> None:
        self.llm = llm
        self.params = SamplingParams(max_tokens=reply_tokens, temperature=0, ignore_eos=True)
        self.waste: list[float] = []
        # Peak KV bytes in use per KV group ("all layers" for a model with one pool).
        self.kv_peak_bytes: dict[str, int] = {}
        if sample_waste:
            llm.loop.add_hook(self._sample_waste)
        if track_kv:
            llm.loop.add_hook(self._track_kv)

    def _track_kv(self, report: StepReport) -> None:
        stats = self.llm.kv_stats(with_blocks=False)
        used = ({g.name: g.used_bytes for g in stats.groups} if len(stats.groups) > 1
                else {"all layers": stats.used_bytes})
        for name, value in used.items():
            self.kv_peak_bytes[name] = max(self.kv_peak_bytes.get(name, 0), value)

    def _sample_waste(self, report: StepReport) -> None:
        stats = self.llm.kv_stats(with_blocks=False)
        if stats.allocated_slots:  # between requests nothing is allocated
            self.waste.append(stats.waste_fraction)

    def reply(self, messages: list[dict]) -> Reply:
        out = self.llm.chat(messages, self.params)
        m = out.metrics
        return Reply(list(out.outputs[0].token_ids), m.ttft_s, m.num_computed_prompt_tokens,
                     m.num_prompt_tokens, wall_s=m.total_s, mean_tok_s=m.decode_tok_s)
