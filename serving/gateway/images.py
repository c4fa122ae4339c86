"""Image inputs of chat requests: `image_url` content parts are accepted only as data URLs (a remote URL
would make the gateway, or the backend, fetch whatever a client names), each validated before anything
reaches a backend (declared type among PNG, JPEG, WebP and GIF and matching the bytes, strict base64,
size, pixel count, decodable), counted against the caller's token limits, and routed only to backends
whose config declares `vision: true`. Each failure is a 400 naming the message and part."""

from __future__ import annotations

import base64
import binascii
import io
import math
from dataclasses import dataclass, replace

from serving.gateway.errors import GatewayError

MEDIA_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP", "image/gif": "GIF"}
TILE = 512  # image tokens follow OpenAI's high-detail rule: a base cost plus a cost per 512-pixel tile
BASE_TOKENS, TILE_TOKENS = 85, 170


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 4 * 1024 * 1024  # decoded size of one image
    max_images: int = 8  # per request
    max_pixels: int = 4096 * 4096


def image_limits(settings) -> ImageLimits:
    return ImageLimits(settings.max_image_bytes, settings.max_images, settings.max_image_pixels)


@dataclass(frozen=True)
class CheckedImage:
    where: str  # "messages[0].content[1]"
    media_type: str
    size_bytes: int
    width: int
    height: int

    @property
    def tokens(self) -> int:
        return BASE_TOKENS + TILE_TOKENS * math.ceil(self.width / TILE) * math.ceil(self.height / TILE)


def image_parts(body: dict):
    """(where, part) of every image_url part of a chat body (already validated as the chat schema)."""
    for m, message in enumerate(body.get("messages") or []):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for p, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") == "image_url":
                    yield f"messages[{m}].content[{p}]", part


def check_images(body: dict, limits: ImageLimits) -> list[CheckedImage]:
    parts = list(image_parts(body))
    if len(parts) > limits.max_images:
        raise bad(f"at most {limits.max_images} images per request, got {len(parts)}", "messages")
    return [check_part(where, part, limits) for where, part in parts]


def check_part(where: str, part: dict, limits: ImageLimits) -> CheckedImage:
    field = part.get("image_url")
    url = field.get("url") if isinstance(field, dict) else None
    if not isinstance(url, str):
        raise bad("an image_url part needs {'image_url': {'url': 'data:image/png;base64,...'}}", where)
    if not url.startswith("data:"):
        raise bad(
            "remote image URLs are not accepted: send the image inline as a data: URL (data:image/png;base64,...)",
            where,
            "remote_image_url",
        )
    header, comma, payload = url[5:].partition(",")
    media_type, _, encoding = header.partition(";")
    if not comma or encoding != "base64":
        raise bad("an image data URL must be data:<type>;base64,<data>", where)
    if media_type not in MEDIA_TYPES:
        raise bad(
            f"image type {media_type!r} is not accepted (one of {', '.join(MEDIA_TYPES)})",
            where,
            "unsupported_image_type",
        )
    if len(payload) > 4 * (limits.max_bytes // 3 + 1):  # before decoding: never allocate for an oversize image
        raise bad(f"image larger than {limits.max_bytes} bytes", where, "image_too_large")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad("image data is not valid base64", where) from None
    if len(data) > limits.max_bytes:
        raise bad(f"image of {len(data)} bytes is larger than {limits.max_bytes}", where, "image_too_large")
    width, height, actual = decode(data, where, limits)
    if actual != MEDIA_TYPES[media_type]:
        raise bad(f"image declared {media_type} but its bytes are {actual}", where, "image_type_mismatch")
    return CheckedImage(where, media_type, len(data), width, height)


def decode(data: bytes, where: str, limits: ImageLimits) -> tuple[int, int, str | None]:
    """Width, height and format (PIL's name, None where it has none) of fully decoded image bytes (a
    truncated or corrupt image fails here)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > limits.max_pixels:
                raise bad(f"image of {width}x{height} pixels is over {limits.max_pixels}", where, "image_too_large")
            image.load()
            return width, height, image.format
    except GatewayError:
        raise
    except Exception as error:  # PIL raises many kinds for undecodable bytes (and DecompressionBombError)
        raise bad(f"image cannot be decoded ({type(error).__name__})", where, "undecodable_image") from None


def vision_only(group, where: str):
    """The group narrowed to its vision backends (the same state objects, so slots are shared), or a 400."""
    backends = [state for state in group.backends if state.spec.vision]
    if not backends:
        raise bad(f"the model '{group.name}' does not accept images", where, "images_not_supported")
    return replace(group, backends=backends)


def bad(message: str, param: str, code: str = "invalid_image") -> GatewayError:
    return GatewayError(400, message, "invalid_request_error", code, param)


def has_images(body: dict) -> bool:
    return next(image_parts(body), None) is not None


async def admit_images(group, body: dict, settings, off_loop: bool) -> tuple[object, int]:
    """(the group narrowed to vision backends, image tokens to reserve) for a chat body with images;
    large bodies are decoded in a thread, off the event loop."""
    import asyncio

    narrowed = vision_only(group, next(image_parts(body))[0])  # refused before any decoding
    limits = image_limits(settings)
    images = await asyncio.to_thread(check_images, body, limits) if off_loop else check_images(body, limits)
    return narrowed, sum(image.tokens for image in images)
