"""``folio bench structured``: what structured output costs, on the same engine in one run.

- Decode with a JSON-schema mask against without: per round, one greedy reply constrained
  to a 20-field schema and one free reply of as many tokens (``ignore_eos``) after the same
  fresh prompt, the two taking turns to go first; each side's rate is 1 / the median gap
  between consecutive tokens, pooled over its rounds.
- Mask compile time of a 20-field schema: first use (a schema never compiled, its field
  names new each round) and cached (the same schema again), medians over the rounds. The
  tokenizer table that grammars share is built once per engine, before the first of
  them, and reported on its own.
- An agent's tool round trip through the API (``tool_choice`` naming a function, the
  call's result sent back): the second request's ``cached_tokens`` over the first
  request's prompt + reply.

No transformers side: it has no grammar engine; the comparison is Folio against itself.
"""

from __future__ import annotations

import statistics
import time

from engine.bench.baselines import median_rate
from engine.bench.common import bench_result, ms
from engine.bench.setup import BenchContext, Target, filler_prompt, run_folio
from engine.sampling_params import ResponseFormat, SamplingParams

FIELDS = 20
MASK_TARGET = "decode tok/s with a JSON-schema mask / without"
FIRST_TARGET = "mask compile ms, 20-field schema, first use"
CACHED_TARGET = "mask compile ms, 20-field schema, cached"
ROUND_TRIP_TARGET = "tool round trip cached tokens / first request's prompt + reply"
_KINDS = ({"type": "string", "maxLength": 16}, {"type": "integer", "minimum": 0,
          "maximum": 9999}, {"type": "boolean"}, {"enum": ["low", "mid", "high"]},
          {"type": "array", "items": {"type": "integer"}, "maxItems": 3})
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string",
                                                             "maxLength": 32}},
                   "required": ["city"]}}}


def schema_of(tag: str) -> dict:
    """A 20-field object of every kind of field, its names carrying ``tag``."""
    names = [f"{tag}_field_{i}" for i in range(FIELDS)]
    return {"type": "object", "properties": {n: _KINDS[i % len(_KINDS)]
                                             for i, n in enumerate(names)},
            "required": names}


def bench_structured(ctx: BenchContext) -> dict:
    s = ctx.settings
    llm = ctx.new_llm()
    llm.generate([filler_prompt(llm.tokenizer, 8, "Warm-up")],
                 SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    grammars = llm.engine.grammars
    start = time.perf_counter()
    grammars.compile(ResponseFormat("json_object"))  # builds the shared tokenizer table
    table_s = time.perf_counter() - start
    first, cached = [], []
    for r in range(s.structured_rounds):
        fmt = ResponseFormat("json_schema", schema_of(f"compile{r}"))
        first.append(_timed(lambda fmt=fmt: grammars.compile(fmt)))
        cached.append(_timed(lambda fmt=fmt: grammars.compile(fmt)))
    masked, free, lengths = _decode(llm, s.structured_rounds, s.structured_tokens)
    cached_ratio, round_trip = _round_trip(llm)
    ratio = round(masked / max(free, 1e-9), 3)
    rows = [{"side": "with a 20-field schema mask", "tok_s": round(masked, 1)},
            {"side": "without a mask", "tok_s": round(free, 1)},
            {"side": "compile, first use", "ms": ms(statistics.median(first))},
            {"side": "compile, cached", "ms": round(statistics.median(cached) * 1e3, 3)},
            {"side": "tool round trip", **round_trip}]
    targets = [Target(MASK_TARGET, ratio, 0.9, ">="),
               Target(FIRST_TARGET, ms(statistics.median(first)), 200.0, "<="),
               Target(CACHED_TARGET, round(statistics.median(cached) * 1e3, 3), 5.0, "<="),
               Target(ROUND_TRIP_TARGET, round(cached_ratio, 3), 0.9, ">=")]
    summary = {"rounds": s.structured_rounds, "constrained_reply_tokens": lengths,
               "tokenizer_table_ms": ms(table_s),
               "rate": "1 / median gap between consecutive tokens, over all rounds"}
    return bench_result("structured", ctx, rows, summary, targets,
                        ["the tokenizer table is built once per engine, on its first "
                         "constrained request, and shared by every schema"])


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _decode(llm, rounds: int, max_tokens: int) -> tuple[float, float, list[int]]:
    constrained = SamplingParams(max_tokens=max_tokens, temperature=0,
                                 response_format=ResponseFormat("json_schema",
                                                                schema_of("decode")))
    # The free side decodes as many tokens as the constrained reply of the first round.
    length = None
    masked_times, free_times, lengths = [], [], []
    for r in range(rounds):
        prompt = filler_prompt(llm.tokenizer, 128, f"Structured round {r}")
        for side in (("masked", "free") if r % 2 == 0 or length is None else
                     ("free", "masked")):
            if side == "masked":
                run = run_folio(llm, prompt, constrained)
                lengths.append(len(run.output.outputs[0].token_ids))
                length = length or max(lengths[-1], 2)
                masked_times.append(run.token_times)
            else:
                free = SamplingParams(max_tokens=length, temperature=0, ignore_eos=True)
                free_times.append(run_folio(llm, prompt, free).token_times)
    return median_rate(*masked_times), median_rate(*free_times), lengths


def _round_trip(llm) -> tuple[float, dict]:
    import openai

    from engine.serve.server import start_in_background
    from engine.worker import EngineWorker

    worker = EngineWorker(llm).start()
    server = start_in_background(worker)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="bench", max_retries=0)
        question = [{"role": "user", "content": "What is the weather in Paris?"}]
        fields = {"model": llm.model_name, "tools": [WEATHER], "temperature": 0,
                  "max_tokens": 128}
        first = client.chat.completions.create(
            messages=question, tool_choice={"type": "function",
                                            "function": {"name": "get_weather"}}, **fields)
        call = first.choices[0].message.tool_calls[0]
        second = client.chat.completions.create(messages=[
            *question, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}],
            **fields)
    finally:
        server.stop()
        worker.shutdown()
    earlier = first.usage.prompt_tokens + first.usage.completion_tokens
    cached = second.usage.prompt_tokens_details.cached_tokens
    return cached / earlier, {"first_tokens": earlier, "cached_tokens": cached}
