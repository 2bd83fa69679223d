"""A draft model: a second, smaller model with the target's vocabulary, run in the same
engine with its own paged KV cache and scheduler, guessing each candidate's next tokens.

Each speculating candidate of the target has a mirror here: a request of the draft's own
whose tokens follow the candidate's. Before a verify step the mirrors catch up with what
the target kept (their tokens cut back to the longest common prefix with the candidate's,
``Scheduler.rewind``, then the candidate's newer tokens appended) and draft greedily, one
forward per token, all mirrors in one batch. The draft's prefix cache works as the
target's: a new turn of a chat, or a candidate of the same prompt, finds its blocks.

Greedy drafts make the proposal one-hot, so engine/spec/verify.py's rule keeps the target's
distribution. A draft model with sliding-window or linear-attention layers is refused: a
mirror cut back would need blocks or a state it no longer holds.
"""

from __future__ import annotations

from dataclasses import replace

from engine.core.sequence import Sequence, common_prefix
from engine.sampling_params import SamplingParams

# The most forwards one proposal may take (a long prompt's first prefill counts), so a
# draft pool out of room never stalls the target: it drafts nothing this time.
_MAX_FORWARDS = 64


class DraftModel:
    method = "draft"

    def __init__(self, parts, target_tokenizer, target_name: str) -> None:
        """``parts``: the draft's EngineParts (engine/build.py)."""
        if not _same_tokens(parts.tokenizer, target_tokenizer):
            raise ValueError(f"EngineConfig.speculative: the draft model {parts.model_name} "
                             f"has another vocabulary than {target_name} (its tokenizer "
                             f"holds {parts.tokenizer.vocab_size} tokens, the target's "
                             f"{target_tokenizer.vocab_size}): a draft model must share the "
                             "target's tokenizer")
        # Weights may have more rows than the tokenizer has tokens (padding): a draft
        # the target has no row for is never proposed.
        self.vocab_size = target_tokenizer.vocab_size
        if any(g.window is not None or g.linear for g in parts.kv_groups):
            raise ValueError(f"EngineConfig.speculative: the draft model {parts.model_name} "
                             "has sliding-window or linear-attention layers, which a draft "
                             "model cannot have yet; pick a small dense model of the same "
                             "family")
        self.name = parts.model_name
        self.runner = parts.runner
        self.scheduler = parts.scheduler
        self.weights_bytes = parts.weights_bytes
        self._mirrors: dict[int, Sequence] = {}  # target seq_id -> the mirror's sequence
        self._params = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)

    # ---------------------------------------------------------------- mirrors
    def _mirror(self, seq: Sequence) -> Sequence | None:
        mirror = self._mirrors.get(seq.seq_id)
        if mirror is not None and mirror.is_finished:
            self.drop(seq)  # the draft pool ended it (out of room): start it again
            mirror = None
        if mirror is None:
            request_id = f"draft:{seq.label}:{seq.seq_id}"
            try:
                request = self.scheduler.add_request(request_id, list(seq.token_ids),
                                                     self._params)
            except ValueError:
                return None  # longer than the draft's context or pool: no drafts
            mirror = self._mirrors[seq.seq_id] = request.seqs[0]
            return mirror
        common = common_prefix(mirror.token_ids, seq.token_ids)
        if common < mirror.num_tokens:
            self.scheduler.rewind(mirror, max(common, 1))
        mirror.token_ids += seq.token_ids[mirror.num_tokens:]
        return mirror

    def drop(self, seq: Sequence) -> None:
        """The target candidate ended: its mirror's blocks go back (cached)."""
        mirror = self._mirrors.pop(seq.seq_id, None)
        if mirror is not None:
            self.scheduler.abort(mirror.request_id)

    def drop_request(self, request_id: str) -> None:
        for seq_id, mirror in list(self._mirrors.items()):
            if mirror.request_id.startswith(f"draft:{request_id}:"):
                del self._mirrors[seq_id]
                self.scheduler.abort(mirror.request_id)

    # ---------------------------------------------------------------- drafts
    def propose(self, wanted: list[tuple[Sequence, int]]) -> dict[int, list[int]]:
        """Up to k greedy drafts for each (target candidate, k), by target seq_id."""
        mirrors = {}
        for seq, k in wanted:
            mirror = self._mirror(seq) if k > 0 else None
            if mirror is not None:
                mirrors[seq.seq_id] = (mirror, seq.num_tokens, k)
        drafts: dict[int, list[int]] = {s: [] for s in mirrors}
        for _ in range(_MAX_FORWARDS):
            if all(len(drafts[s]) >= k for s, (_, _, k) in mirrors.items()):
                break
            out = self.scheduler.schedule()
            logits = self.runner.execute(out)
            sampled = [item.seq for item in out.scheduled if item.samples]
            self.scheduler.mark_computed(out)
            if logits is None:
                continue
            tokens = logits[:, :self.vocab_size].argmax(dim=-1).tolist()
            for mirror, token in zip(sampled, tokens, strict=True):
                mirror.append_token(token)
            for target_id, (mirror, start, _k) in mirrors.items():
                drafts[target_id] = mirror.token_ids[start:]
            self.scheduler.remove_finished()
        return {s: d[:mirrors[s][2]] for s, d in drafts.items()}


def _same_tokens(a, b) -> bool:
    """Two ChatTokenizers with the same tokens at the same ids (checked on a spread of
    ids: comparing a whole vocabulary costs more than a load should)."""
    n = a.vocab_size
    if n != b.vocab_size:
        return False
    ids = sorted({*range(min(n, 512)), *range(0, n, max(1, n // 4096)), n - 1})
    return a.hf.convert_ids_to_tokens(ids) == b.hf.convert_ids_to_tokens(ids)


def draft_config(config, max_model_len: int):
    """The draft's EngineConfig: the target's device and precision, its own pool, no disk
    tier, no speculation of its own."""
    return replace(config, speculative=None, kv_disk_bytes=0, warm_up=False,
                   max_model_len=max_model_len, num_gpu_blocks=None)
