"""The one prompt builder: a ``ChatRequest`` in, prompt ids and how to read the reply out.

``PromptBuilder`` is made once per loaded model (``LLMEngine.prompts``) and read by every
front end: the app's context planner measures a branch with it and submits the prompt it
measured, ``folio serve`` and ``folio chat`` build theirs with it, and the engine builds
one for a request that arrives as messages. The chat template is rendered once per
prompt, on the caller's thread; the engine runs the ids it is handed.

What the template shows is read once from its source: the family's tool-call format and
what it can show of tools (tool_prompt.py), the reasoning format of its replies and its
``enable_thinking`` / ``reasoning_effort`` variables (engine/text/reasoning), whether it
drops earlier replies' thinking (history.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from engine.chat.attachments import AttachedDocument, Attachments
from engine.chat.continued import replay_text, reply_ids
from engine.chat.history import drops_thinking, with_thinking
from engine.chat.reply import ReplyPlan
from engine.chat.reply_tokens import ReplyTokens
from engine.chat.request import ChatRequest, content_text
from engine.chat.tool_prompt import ModelTools, template_source, tool_prompt
from engine.core.sequence import ImageSpan
from engine.outputs import RequestOutput
from engine.sampling_params import ResponseFormat, SamplingParams
from engine.text.chat_template import ChatTokenizer
from engine.text.reasoning import reasoning_format
from engine.text.reasoning.formats import TAIL_TOKENS, has_effort_setting, has_think_switch
from engine.vision.prompt import ImageReader, expand_images

if TYPE_CHECKING:
    from engine.embeddings import Embedder
    from engine.vision.model import PreparedImage, VisionModel


@dataclass(slots=True, frozen=True)
class ChatPrompt:
    """A built prompt: the ids the engine runs, how its replies are read, and what reading
    them asks of sampling. ``recomputed``: tokens of the last reply that go back as text
    (history.py), for the reply's metrics."""

    ids: list[int]
    plan: ReplyPlan
    stop_ids: tuple[int, ...] = ()  # the call format's end-of-call tokens
    call_format: ResponseFormat | None = None  # a forced call, for a family without a format
    recomputed: int = 0
    request: ChatRequest | None = None  # what it was built from; None for a text prompt
    documents: tuple[AttachedDocument, ...] = ()  # attached files, each whole or retrieved
    images: tuple[ImageSpan, ...] = ()  # its images' places (engine/vision/prompt.py)

    def sampling(self, params: SamplingParams) -> SamplingParams:
        """``params`` as reading the reply needs them: a constrained call's schema, the
        call format's markers (often special tokens) kept in the text and its end tokens
        as stops, a reasoning format's special-token markers kept. Applying it twice
        changes nothing."""
        changes: dict = {}
        if self.call_format is not None:
            changes["response_format"] = self.call_format
        if self.plan.tool_format is not None:
            changes["skip_special_tokens"] = False
            stops = [t for t in self.stop_ids if t not in params.stop_token_ids]
            if stops:
                changes["stop_token_ids"] = [*params.stop_token_ids, *stops]
        reasoning = self.plan.reasoning
        constrained = params.response_format is not None or self.call_format is not None
        if reasoning is not None and reasoning.keeps_special_tokens and not constrained \
                and not self.plan.prefix:
            changes["skip_special_tokens"] = False
        changes = {k: v for k, v in changes.items() if getattr(params, k) != v}
        return replace(params, **changes) if changes else params


class PromptBuilder:
    """``build(request)``: the prompt; ValueError (``InvalidField``, naming the field
    where it can) for what the model or its template cannot take. Thread-safe."""

    def __init__(self, tokenizer: ChatTokenizer, model_type: str,
                 max_model_len: int | None = None,
                 vision: VisionModel | None = None, embedder: Embedder | None = None
                 ) -> None:
        """``vision``: the model's image encoder (engine/vision), which lets messages
        carry image parts; without it an image part is refused by name. ``embedder``:
        the embedding model a long document's retrieval ranks with (beside BM25)."""
        self.tokenizer = tokenizer
        self.vision = vision
        self._images = ImageReader(vision) if vision is not None else None
        source = template_source(tokenizer.hf)
        self.tools = ModelTools.of(model_type, source)
        self.reasoning = reasoning_format(source)
        self.has_think_switch = has_think_switch(source)
        self.has_effort_setting = has_effort_setting(source)
        self._drops_thinking = self.reasoning is not None and drops_thinking(
            lambda conversation: tokenizer.hf.apply_chat_template(
                conversation, add_generation_prompt=True, tokenize=False))
        # Recent replies' exact ids by their text: spliced back where a history comes
        # back as text (a client's, or calls shown as text) so it stays cached.
        self.replies = ReplyTokens()
        # Attached files (engine/chat/attachments.py): whole after the system prompt when
        # they fit in max_model_len with room for the conversation, else retrieved.
        self.attachments = Attachments(self._count_text, max_model_len, embedder=embedder)

    def build(self, request: ChatRequest) -> ChatPrompt:
        if request.continue_reply:
            return self._continued(request)
        messages, documents = self.attachments.lift(list(request.messages))
        messages, images = self._messages(messages)
        messages, attached = self.attachments.place(messages, documents)
        history = with_thinking(messages, self.reasoning, self._drops_thinking,
                                self._count_text)
        # Tools given (even with tool_choice none: a template may still show them) or an
        # earlier call in the history: the tool prompt shows what the template can.
        if request.tools.tools or request.has_tool_history:
            made = tool_prompt(self.tools, request.tools, history.messages, self.tokenizer,
                               self.replies, request.options)
            plan = ReplyPlan(made.fmt, made.prefix, made.max_calls,
                             made.call_format is not None, self.reasoning,
                             self._tail(made.ids))
            return self._with_images(ChatPrompt(made.ids, plan, made.stop_ids,
                                                made.call_format, history.recomputed,
                                                request, attached), images)
        ids = self.tokenizer.encode_chat(history.messages, **request.options.variables())
        return self._with_images(
            ChatPrompt(ids, ReplyPlan(reasoning=self.reasoning, prompt_tail=self._tail(ids)),
                       recomputed=history.recomputed, request=request, documents=attached),
            images)

    def _messages(self, messages: list) -> tuple[list[dict], list[PreparedImage]]:
        """The messages with text content, and their images in order (each one a
        marker in its message's text)."""
        if self._images is None:
            return [_engine_message(m, i) for i, m in enumerate(messages)], []
        out, images = [], []
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise ValueError(f"messages[{i}] must be a dict with role and content")
            message, found = self._images.message(m, i)
            out.append(_engine_message(message, i))
            images += found
        return out, images

    def _with_images(self, prompt: ChatPrompt, images: list[PreparedImage]) -> ChatPrompt:
        """Each image's marker token replaced by the image's tokens."""
        if self.vision is None:
            return prompt
        # A family whose image text opens or closes with plain text (Gemma 3's newlines)
        # has it tokenized with the text it joins, as its processor does.
        joins = self.vision.joins_text
        ids, spans = expand_images(
            prompt.ids, images, self.vision.marker_id,
            lambda text: self.tokenizer.encode(text, add_special_tokens=False),
            self.vision.image_token_id if self.vision.bidirectional else None,
            (lambda ids: self.tokenizer.hf.decode(ids, skip_special_tokens=False,
                                                  clean_up_tokenization_spaces=False))
            if joins else None, self.tokenizer.special_ids if joins else frozenset())
        return replace(prompt, ids=ids, images=spans) if spans else prompt


    def _continued(self, request: ChatRequest) -> ChatPrompt:
        """A ``continue_reply`` request (engine.chat.continued): the prompt the reply
        answered, built again from the messages before it, then the reply's ids with its
        turn left open; its text replayed into the new reader."""
        base = self.build(replace(request, messages=request.messages[:-1],
                                  continue_reply=False))
        ids = reply_ids(request.messages[-1], self.tokenizer)
        keeps_special = base.sampling(SamplingParams()).skip_special_tokens is False
        replay = replay_text(ids, self.tokenizer, keeps_special)
        return replace(base, ids=[*base.ids, *ids], plan=replace(base.plan, replay=replay),
                       request=request)
    def count(self, request: ChatRequest) -> int:
        return len(self.build(request).ids)

    def remember(self, output: RequestOutput) -> None:
        """A finished chat reply's ids, for when its text comes back in a history."""
        self.replies.remember(output)

    def _tail(self, ids: list[int]) -> str:
        """The prompt's end as text, special tokens kept: how the reply opens (inside its
        thinking, or a harmony channel already chosen)."""
        if self.reasoning is None:
            return ""
        return self.tokenizer.decode(ids[-TAIL_TOKENS:], skip_special_tokens=False)

    def _count_text(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))


def _engine_message(message: dict, i: int) -> dict:
    """A message with its content as text (content parts joined), the rest as it came."""
    if not isinstance(message, dict):
        raise ValueError(f"messages[{i}] must be a dict with role and content")
    content = message.get("content")
    if isinstance(content, str):
        return message
    return {**message, "content": content_text(content, f"messages[{i}].content")}
