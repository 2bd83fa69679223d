"""Image bytes to a decoded RGB picture, refusing what must not be decoded.

Every front end hands the engine an image as bytes (a data: URL's payload, a file's
content). ``decode_image`` reads the header first: a format outside PNG, JPEG, WebP and
GIF, or a picture whose size alone says it would not fit in memory (a decompression
bomb: a few kilobytes that unpack to gigabytes) is refused before any pixel is
decoded. What passes is decoded (a GIF's first frame), its transparency laid over
white (what transformers' ``convert_to_rgb`` does), and scaled down when one side is
longer than ``max_side`` (a 10,000 x 10,000 photo is kept, at a size a vision model
can take). Every refusal is an ``ImageError`` (a ValueError) that names its reason.

``content_key`` is the image's identity for the encoder cache and the prefix cache: a
hash of the decoded pixels, so the same picture sent as PNG or as lossless WebP is one
image, and two different pictures of one size are never confused.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
# A picture of more pixels than this is refused from its header: past a 10,000 x 10,000
# photo (which is scaled down instead), below Pillow's own bomb error (2 x 89.5 M).
MAX_PIXELS = 120_000_000
# The longest side kept after decoding; each model's processor resizes further.
MAX_SIDE = 4096


class ImageError(ValueError):
    """An image that cannot be used; ``reason`` is one of "not_an_image",
    "unsupported_format", "too_large", "corrupt"."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(slots=True, frozen=True)
class DecodedImage:
    image: Image.Image  # RGB, at most MAX_SIDE on its longer side
    key: bytes  # content_key of its pixels
    source_size: tuple[int, int]  # (width, height) as the file stored it
    format: str


def decode_image(data: bytes, where: str = "image", max_side: int = MAX_SIDE,
                 max_pixels: int = MAX_PIXELS) -> DecodedImage:
    """``data`` decoded (see the module docstring); ``where`` names the field in errors."""
    if not isinstance(data, bytes | bytearray | memoryview) or not data:
        raise ImageError("not_an_image", f"{where}: empty image data")
    with warnings.catch_warnings():
        # Our own limit decides, below Pillow's warning threshold or above it.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            picture = Image.open(io.BytesIO(bytes(data)))  # reads the header only
        except UnidentifiedImageError:
            raise ImageError("not_an_image", f"{where}: not an image (PNG, JPEG, WebP or "
                             "GIF)") from None
        except Image.DecompressionBombError:
            raise ImageError("too_large", f"{where}: the image's header declares more "
                             f"than {max_pixels:,} pixels; refused before decoding") from None
        except (OSError, ValueError, SyntaxError) as exc:
            raise ImageError("corrupt", f"{where}: unreadable image header ({exc})") from None
        if picture.format not in FORMATS:
            raise ImageError("unsupported_format", f"{where}: {picture.format} images are "
                             f"not accepted; send {', '.join(FORMATS)}")
        width, height = picture.size
        if width < 1 or height < 1 or width * height > max_pixels:
            raise ImageError("too_large", f"{where}: {width} x {height} pixels is more than "
                             f"the {max_pixels:,} accepted; refused before decoding")
        if picture.format == "JPEG":
            # JPEG decodes at 1/2, 1/4 or 1/8 scale directly: a huge photo never
            # reaches memory at full size.
            picture.draft("RGB", (max_side, max_side))
        try:
            picture.seek(0)  # a GIF's first frame
            picture.load()
        except Exception as exc:  # Pillow raises OSError, SyntaxError, struct.error ...
            raise ImageError("corrupt", f"{where}: the image data is corrupt or truncated "
                             f"({exc})") from None
    rgb = to_rgb(picture)
    if max(rgb.size) > max_side:
        rgb.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    return DecodedImage(rgb, content_key(rgb), (width, height), picture.format)


def to_rgb(picture: Image.Image) -> Image.Image:
    """RGB; transparent pixels laid over white (transformers' ``convert_to_rgb``)."""
    if picture.mode == "RGB":
        return picture
    if picture.mode in ("RGBA", "LA", "PA") or (picture.mode == "P"
                                                 and "transparency" in picture.info):
        rgba = picture.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return picture.convert("RGB")


def content_key(rgb: Image.Image) -> bytes:
    """A 16-byte hash of an RGB picture's size and pixels."""
    h = hashlib.blake2b(digest_size=16, person=b"folio-image")
    h.update(f"{rgb.width}x{rgb.height}".encode())
    h.update(rgb.tobytes())
    return h.digest()
