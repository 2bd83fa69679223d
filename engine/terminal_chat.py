"""``folio chat``'s conversation in the terminal: the messages so far, a line of input at
a time (a message, or a command: /regen, /new, /image, /stats, /quit), each reply
streamed as the engine reads it, and the files and images attached to it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

HELP = "/regen N  N new candidates for the last reply   /new  new chat   " \
       "/image PATH  attach an image   /stats  KV cache   /quit"


def format_kv_stats(stats) -> str:
    mib = 1 << 20
    return (
        f"KV blocks: {stats.num_used} used ({stats.num_shared} shared), "
        f"{stats.num_free} free ({stats.num_cached} cached) of {stats.num_blocks} "
        f"x {stats.block_size} tokens, {stats.bytes_per_block / mib:.2f} MiB each\n"
        f"saved by sharing: {stats.bytes_saved_by_sharing / mib:.1f} MiB; "
        f"internal waste: {stats.waste_fraction:.1%}; prefix-cache hits: "
        f"{stats.prefix_hit_tokens}/{stats.prefix_query_tokens} tokens ({stats.hit_rate:.0%})"
    ) + "".join(  # a line per KV group (Gemma's global and sliding layers), if several
        f"\n  {g.name}: {g.num_layers} layer{'s' if g.num_layers != 1 else ''}, "
        f"{g.num_used} used, {g.num_free} free of {g.num_blocks}, "
        f"{g.bytes_per_block / mib:.2f} MiB each"
        for g in (stats.groups if len(stats.groups) > 1 else ()))


class TerminalChat:
    def __init__(self, llm, params, out: TextIO = sys.stdout,
                 reasoning_effort: str | None = None, files: list[dict] | None = None) -> None:
        self.llm = llm
        # `--file` parts, attached to each chat's first question (engine/documents).
        self.files = files or []
        # For the chat template (gpt-oss's harmony reads it; others ignore it).
        self.reasoning_effort = reasoning_effort
        self.params = params
        self.out = out
        self.messages: list[dict] = []
        self.images: list[bytes] = []  # attached to the next message (--image, /image)

    def reply(self, n: int = 1):
        """Stream ``n`` candidates for the current messages, one after another."""
        from dataclasses import replace

        from engine.chat import ChatRequest
        from engine.outputs import TextDelta, Thinking, TokenEvent
        from engine.text.reasoning.options import TemplateOptions

        thinking = [False]

        def stream(event) -> None:
            # The first candidate streams (its thinking, then a rule, then the answer);
            # the others print when all are done.
            if not isinstance(event, TokenEvent) or event.index != 0:
                return
            for part in event.parts:
                if isinstance(part, Thinking):
                    thinking[0] = True
                    self.out.write(part.text)
                elif isinstance(part, TextDelta):
                    if thinking[0]:
                        thinking[0] = False
                        self.out.write("\n---\n")
                    self.out.write(part.text)
            self.out.flush()

        request = ChatRequest(self.messages,
                              options=TemplateOptions(reasoning_effort=self.reasoning_effort))
        result = self.llm.loop.run([request], replace(self.params, n=n), stream)[0]
        for cand in result.outputs[1:]:
            self.out.write(f"\n--- candidate {cand.index + 1} ---\n{cand.reply.content}")
        m = result.metrics
        drafts = "" if m.draft_acceptance is None else \
            f"; drafts {m.draft_acceptance:.0%} accepted"
        self.out.write(
            f"\n[{m.num_prompt_tokens} prompt tokens, {m.num_cached_tokens} cached; "
            f"first token {m.ttft_s * 1e3:.0f} ms; {m.decode_tok_s:.1f} tok/s{drafts}]\n"
        )
        return result

    def handle(self, line: str) -> bool:
        """One line of input; returns False to quit."""
        line = line.strip()
        if not line:
            return True
        if line in ("/quit", "/exit"):
            return False
        if line == "/new":
            self.messages = []
            self.out.write("(new chat)\n")
        elif line == "/stats":
            self.out.write(format_kv_stats(self.llm.kv_stats()) + "\n")
        elif line.startswith("/regen"):
            parts = line.split()
            n = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 1
            if not self.messages or self.messages[-1]["role"] != "assistant":
                self.out.write("(nothing to regenerate yet)\n")
                return True
            self.messages.pop()
            self._keep(self.reply(n))
        elif line.startswith("/image"):
            self.attach(line.removeprefix("/image").strip())
            self.out.write(f"({len(self.images)} image(s) attached to your next message)\n")
        elif line.startswith("/"):
            self.out.write(f"unknown command; {HELP}\n")
        else:
            first = not any(m["role"] == "user" for m in self.messages)
            files = list(self.files) if first else []
            parts = [{"type": "image", "image": data} for data in self.images]
            content = [*files, *parts, {"type": "text", "text": line}] \
                if files or parts else line
            self.messages.append({"role": "user", "content": content})
            try:
                result = self.reply(1)
            except ValueError:
                self.messages.pop()  # a refused image: the chat goes on without it
                self.images = []
                raise
            self.images = []
            self._keep(result)
        return True

    def attach(self, path: str) -> None:
        """An image file for the next message; ValueError naming it if unreadable."""
        try:
            self.images.append(Path(path).expanduser().read_bytes())
        except OSError as exc:
            raise ValueError(f"--image {path}: cannot be read ({exc.strerror})") from None

    def _keep(self, result) -> None:
        first = result.outputs[0]
        message = {"role": "assistant", "content": first.reply.content,
                   "token_ids": list(first.token_ids)}
        if first.reply.reasoning:
            message["reasoning_content"] = first.reply.reasoning
        self.messages.append(message)


def attach_files(llm, paths: list[str]) -> list[dict]:
    """`--file` paths as file content parts, each read (and its text stored) now, so a bad
    file ends the command before the chat starts; prints how each is read."""
    import mimetypes

    from engine.chat import ChatRequest
    from engine.documents import file_data_url

    parts = []
    for path in map(Path, paths):
        media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        parts.append({"type": "file", "file": {
            "file_data": file_data_url(path.expanduser().read_bytes(), media_type),
            "filename": path.name}})
    if parts:
        probe = ChatRequest([{"role": "user", "content": parts}])
        for doc in llm.engine.prompts.build(probe).documents:
            how = "read whole, kept warm" if doc.mode == "whole" else \
                "too long for the context: its passages are searched for each question"
            print(f"Attached {doc.name} ({doc.kind}, {doc.tokens:,} tokens): {how}")
    return parts
