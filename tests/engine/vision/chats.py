"""The image chats every vision family's engine tests run against transformers (or a
GGUF against its folder): one image, two images, an image in an earlier turn; greedy
replies of 16 tokens."""

from __future__ import annotations

from engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


def image(data: bytes) -> dict:
    return {"type": "image", "image": data}


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def image_chats(one: bytes, two: tuple[bytes, bytes], earlier: bytes
                ) -> tuple[dict[str, list[dict]], dict[str, list[bytes]]]:
    """The chats by name, and the pictures each holds in order."""
    chats = {
        "one image": [{"role": "user", "content": [text("what is "), image(one), text("?")]}],
        "two images": [{"role": "user",
                        "content": [image(two[0]), text(" and "), image(two[1])]}],
        "earlier turn": [
            {"role": "user", "content": [text("see "), image(earlier)]},
            {"role": "assistant", "content": "a picture"},
            {"role": "user", "content": "and now?"},
        ],
    }
    return chats, {"one image": [one], "two images": list(two), "earlier turn": [earlier]}


def mmproj_chats(shown: bytes, other: bytes) -> dict[str, list[dict]]:
    """The two chats every mmproj test replays: ``shown`` in one turn, and ``other`` in an
    earlier turn that a text question follows."""
    chats, _ = image_chats(shown, (other, shown), other)
    return {name: chats[name] for name in ("one image", "earlier turn")}
