"""Conversations in, replies out: the one prompt builder (``PromptBuilder``: a
``ChatRequest`` to prompt ids) and the one reply reader (``ReplyReader``: a candidate's
stream to typed events and its finished message), for the app and the server alike."""

from engine.chat.prompt import ChatPrompt, PromptBuilder
from engine.chat.reply import PLAIN, ReplyPlan, ReplyReader
from engine.chat.request import ChatRequest

__all__ = ["PLAIN", "ChatPrompt", "ChatRequest", "PromptBuilder", "ReplyPlan", "ReplyReader"]
