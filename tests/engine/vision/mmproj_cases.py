"""What the mmproj tests of every family compare: a tiny folder's vision model and the
one its mmproj GGUF gives, both with float32 towers (the oracle's precision), and an
image's preparation and embeddings through either."""

from __future__ import annotations

import torch

from engine.loaders.gguf.mmproj import read_mmproj_header
from engine.vision.decode import decode_image
from engine.vision.load import load_vision
from engine.vision.mmproj import load_mmproj


def folder_vision(folder):
    return load_vision(folder, torch.float32, encoder_dtype=torch.float32)


def mmproj_vision(path, text_model):
    return load_mmproj(read_mmproj_header(path), text_model.tokenizer,
                       text_model.config.hidden_size, torch.float32,
                       encoder_dtype=torch.float32)


def embeddings(vision, data: bytes):
    prepared = vision.prepare(decode_image(data, "test"))
    return prepared, vision.encode(prepared)
