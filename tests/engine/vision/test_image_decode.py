"""engine.vision.decode: accepted formats, and each bad input refused with its reason."""

from __future__ import annotations

import io
import struct
import time
import zlib

import pytest
from PIL import Image

from engine.vision.decode import ImageError, content_key, decode_image


def encoded(picture: Image.Image, fmt: str, **kw) -> bytes:
    out = io.BytesIO()
    picture.save(out, format=fmt, **kw)
    return out.getvalue()


def picture(size=(32, 24), colour=(200, 30, 40), mode="RGB") -> Image.Image:
    return Image.new(mode, size, colour)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_each_accepted_format_decodes_to_rgb(fmt):
    got = decode_image(encoded(picture(), fmt))
    assert got.format == fmt and got.image.mode == "RGB" and got.image.size == (32, 24)


def test_a_gif_gives_its_first_frame():
    frames = [picture(colour=(255, 0, 0)), picture(colour=(0, 0, 255))]
    data = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:])
    red, green, blue = decode_image(data).image.getpixel((0, 0))
    assert red > 200 and blue < 50


def test_transparency_is_laid_over_white():
    got = decode_image(encoded(picture(colour=(0, 0, 0, 0), mode="RGBA"), "PNG"))
    assert got.image.getpixel((3, 3)) == (255, 255, 255)


def test_the_key_is_the_pixels_not_the_file():
    same = picture()
    png, webp = encoded(same, "PNG"), encoded(same, "WEBP", lossless=True)
    assert decode_image(png).key == decode_image(webp).key == content_key(same)
    other = picture(colour=(200, 30, 41))
    assert decode_image(encoded(other, "PNG")).key != decode_image(png).key


def test_not_an_image():
    with pytest.raises(ImageError, match="not an image") as err:
        decode_image(b"hello, this is text under an image/png type", "messages[0]")
    assert err.value.reason == "not_an_image" and isinstance(err.value, ValueError)
    with pytest.raises(ImageError, match="empty"):
        decode_image(b"")


def test_an_unsupported_format_is_named():
    with pytest.raises(ImageError, match="BMP images are not accepted") as err:
        decode_image(encoded(picture(), "BMP"))
    assert err.value.reason == "unsupported_format"


def test_a_truncated_image_is_corrupt():
    data = encoded(Image.effect_noise((64, 64), 50).convert("RGB"), "PNG")
    with pytest.raises(ImageError, match="corrupt or truncated") as err:
        decode_image(data[:len(data) // 2])
    assert err.value.reason == "corrupt"


def _png_claiming(width: int, height: int) -> bytes:
    """A valid 1 x 1 PNG whose header says ``width`` x ``height``: a bomb's shape."""
    data = bytearray(encoded(picture((1, 1)), "PNG"))
    ihdr = 8 + 8  # signature, then the IHDR chunk's length and type
    data[ihdr:ihdr + 8] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[ihdr - 4:ihdr + 13]))
    data[ihdr + 13:ihdr + 17] = struct.pack(">I", crc)
    return bytes(data)


@pytest.mark.parametrize("side", [12_000, 100_000])
def test_a_decompression_bomb_is_refused_from_its_header(side):
    start = time.perf_counter()
    with pytest.raises(ImageError, match="refused before decoding") as err:
        decode_image(_png_claiming(side, side))
    assert err.value.reason == "too_large"
    assert time.perf_counter() - start < 1.0  # nothing was decoded


def test_a_huge_photo_is_scaled_down():
    data = encoded(Image.new("L", (10_000, 10_000), 128), "JPEG", quality=50)
    got = decode_image(data)
    assert got.source_size == (10_000, 10_000)
    assert max(got.image.size) <= 4096 and got.image.mode == "RGB"
    wide = decode_image(encoded(picture((3000, 200)), "PNG"), max_side=1000)
    assert wide.image.size == (1000, 67)
