"""The sides of ``folio bench speculative`` that run in a process of their own
(``probe.run_probe``): Folio with every way of drafting in one process (``folio``), and
llama.cpp plain or with its prompt-lookup drafts (``llama_cpp``), one process each.

Every side answers the same prompt ids (``chats``: a chat's name to its ids, rendered once
with the starter's chat template) greedily and reports per run the decode rate from the
first token to the last, the reply's ids and, for Folio, the drafts checked and kept.

Nothing heavy is imported at the top: a llama.cpp side runs under an interpreter with
llama-cpp-python and without torch.
"""

from __future__ import annotations

import time

from engine.bench.probe import emit
from engine.core.sequence import common_prefix

# Folio's ways to decode a chat, by name:
# "plain": no drafts; "ngram": prompt lookup over the request's own tokens;
# "exact": Predicted Outputs with the plain reply's text (or its ids) as the prediction;
# "exact_k4": the same on an engine that checks at most 4 drafts per step;
# "code": Predicted Outputs with the code of the prompt (``prediction``) as the prediction;
# "self_k4": the model drafting for itself (``draft:`` the same file), at most 4 a step.
VARIANTS = ("plain", "ngram", "exact", "exact_k4", "code", "self_k4")
LLAMA_LOOKUP_TOKENS = 10  # LlamaPromptLookupDecoding(num_pred_tokens=...)


def prompt_ids(model_path: str) -> None:
    """Emit ``chats``: each chat of speculative_text as one user turn rendered with the
    model's chat template, and ``stop_ids``: the model's end-of-reply tokens."""
    from engine.bench.setup import folio_config
    from engine.bench.speculative_text import CHATS
    from engine.chat.request import ChatRequest
    from engine.llm import LLM

    llm = LLM(model_path, folio_config(1, "stored"))
    emit({"chats": {name: llm.prompts.build(ChatRequest([{"role": "user", "content": text}]))
                    .ids for name, text in CHATS.items()},
          "stop_ids": sorted(llm.tokenizer.eos_token_ids)})


def folio(model_path: str, threads: int, chats: dict[str, list[int]],
          tasks: list[list[str]], max_tokens: int, runs: int, ignore_eos: bool,
          num_speculative_tokens: int, prediction: str = "", exact_ids: bool = False) -> None:
    """Load Folio, then ``runs`` rounds of every (chat, variant) of ``tasks`` in turn (a
    chat's "plain" first: "exact" predicts its reply, as text, or with ``exact_ids`` as
    its token ids on float32 KV pools: a random model's reply text tokenizes to other
    ids, and its near ties go another way where a verify step's float16 keys are summed
    in another order than decode's). Emits ``{chat}/{variant}`` ->
    {"tok_s": [rate of each run], "ids": the first run's reply, "drafted", "accepted"}
    after each run, so a side cut short still reports what it finished."""
    import torch

    from engine.bench.setup import folio_config
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    for _, variant in tasks:
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    torch.set_num_threads(threads)
    n_ctx = max(len(ids) for ids in chats.values()) + max_tokens + 16
    engines: dict[str, LLM] = {}

    def engine(variant: str) -> LLM:
        """The engine a variant runs on: the k = 4 ones have their own."""
        name = variant if variant.endswith("_k4") else "default"
        if name not in engines:
            engines[name] = LLM(model_path, folio_config(
                threads, "stored", max_model_len=n_ctx, block_size=16,
                kv_cache_dtype="float32" if exact_ids else None,
                num_gpu_blocks=2 * -(-n_ctx // 16),
                num_speculative_tokens=4 if variant.endswith("_k4") else num_speculative_tokens,
                speculative=f"draft:{model_path}" if variant == "self_k4" else None))
        return engines[name]

    plain_reply: dict[str, str | list[int]] = {}  # a chat's plain reply, text or ids
    got: dict[str, dict] = {}
    engine("plain")
    emit({"loaded": True})
    warm = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    for variant in dict.fromkeys(v for _, v in tasks):
        engine(variant).generate([next(iter(chats.values()))[:8]], warm)
    for _ in range(runs):
        for chat, variant in tasks:
            extra: dict = {"speculative": {"plain": "off", "self_k4": "draft"}.get(
                variant, "ngram")}
            if variant in ("exact", "exact_k4"):
                extra["prediction"] = plain_reply[chat]
            elif variant == "code":
                extra["prediction"] = prediction
            params = SamplingParams(max_tokens=max_tokens, temperature=0,
                                    ignore_eos=ignore_eos, **extra)
            llm = engine(variant)
            out = llm.generate([chats[chat]], params)[0]
            m = out.metrics
            key = f"{chat}/{variant}"
            if key not in got:
                got[key] = {"tok_s": [], "ids": list(out.outputs[0].token_ids),
                            "drafted": m.num_draft_tokens,
                            "accepted": m.num_accepted_draft_tokens}
            if variant == "plain" and chat not in plain_reply and exact_ids:
                plain_reply[chat] = list(out.outputs[0].token_ids)
            elif variant == "plain" and chat not in plain_reply:
                plain_reply[chat] = out.outputs[0].text
                # The prediction is text: where it tokenizes to other ids than the reply's
                # (random tokens often do), its drafts there cannot be kept.
                again = llm.tokenizer.encode(plain_reply[chat], add_special_tokens=False)
                ids = got[key]["ids"]
                while ids and ids[-1] in llm.tokenizer.eos_token_ids:
                    ids = ids[:-1]
                got[key]["text_ids"] = [common_prefix(again, ids), len(ids)]
            got[key]["tok_s"].append(m.decode_tok_s)
            emit({key: got[key]})


def llama_cpp(model_path: str, threads: int, chats: dict[str, list[int]], lookup: bool,
              max_tokens: int, runs: int, stop_ids: list[int]) -> None:
    """llama.cpp on ``model_path``, plain or (``lookup``) with ``LlamaPromptLookupDecoding``
    as its draft model; ``runs`` rounds of each chat, greedy, ending at one of
    ``stop_ids`` or ``max_tokens``. Emits ``{chat}/{"lookup" or "plain"}`` as Folio's."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from engine.bench.baselines import LlamaCppChat

    n_ctx = max(len(ids) for ids in chats.values()) + max_tokens + 2 * LLAMA_LOOKUP_TOKENS + 16
    # A draft model makes llama.cpp keep every position's logits, but it sizes that buffer
    # by the logits_all argument (n_batch rows without it): past n_batch positions the
    # verify step would overflow it, so the argument is given as the drafts use it.
    options = {"draft_model": LlamaPromptLookupDecoding(num_pred_tokens=LLAMA_LOOKUP_TOKENS),
               "logits_all": True} if lookup else {}
    llm = LlamaCppChat(model_path, threads, n_ctx, **options).llm
    emit({"loaded": True})
    _llama_reply(llm, next(iter(chats.values()))[:8], 4, set())
    got: dict[str, dict] = {}
    stops = set(stop_ids)
    for _ in range(runs):
        for chat, ids in chats.items():
            key = f"{chat}/{'lookup' if lookup else 'plain'}"
            tokens, rate = _llama_reply(llm, ids, max_tokens, stops)
            got.setdefault(key, {"tok_s": [], "ids": tokens})["tok_s"].append(rate)
            emit({key: got[key]})


def _llama_reply(llm, ids: list[int], max_tokens: int, stops: set[int]
                 ) -> tuple[list[int], float]:
    """Greedy tokens after ``ids`` and the rate from the first to the last."""
    llm.reset()  # each run decodes the whole reply again, drafts included
    tokens: list[int] = []
    times: list[float] = []
    for token in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                              repeat_penalty=1.0, reset=True):
        times.append(time.perf_counter())
        if int(token) in stops:
            break
        tokens.append(int(token))
        if len(tokens) == max_tokens:
            break
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    return tokens, rate
