"""Image parts of chat requests (serving/gateway/images.py) without servers: data URLs only, type, size,
pixels and decodability checked, tokens counted, and routing narrowed to vision backends."""

from __future__ import annotations

import asyncio
import base64
import io
import math

import pytest
from PIL import Image

from serving.gateway.balancer import BackendState
from serving.gateway.config import BackendSpec, Settings
from serving.gateway.errors import GatewayError
from serving.gateway.images import ImageLimits, admit_images, check_images, has_images, vision_only
from serving.gateway.service import ModelGroup
from serving.gateway.tokens import TokenCounter


def image_bytes(width: int, height: int, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format=fmt)
    return buffer.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def body_with(*urls: str) -> dict:
    parts = [{"type": "text", "text": "describe"}] + [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"model": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": parts}]}


def refused(body: dict, limits: ImageLimits | None = None) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        check_images(body, limits or ImageLimits())
    assert caught.value.status == 400
    return caught.value


def group(*vision: bool) -> ModelGroup:
    states = [BackendState(BackendSpec(model_name="m", url=f"http://b{i}", vision=v)) for i, v in enumerate(vision)]
    return ModelGroup("m", states, TokenCounter(None), 16, "openai")


def test_valid_images_are_measured_and_counted_by_tiles():
    checked = check_images(
        body_with(data_url(image_bytes(600, 300)), data_url(image_bytes(64, 64, "JPEG"), "image/jpeg")), ImageLimits()
    )
    assert [(c.where, c.media_type, c.width, c.height) for c in checked] == [
        ("messages[1].content[1]", "image/png", 600, 300),
        ("messages[1].content[2]", "image/jpeg", 64, 64),
    ]
    for c in checked:  # recomputed from the pixel sizes: 85 + 170 per started 512-pixel tile
        assert c.tokens == 85 + 170 * math.ceil(c.width / 512) * math.ceil(c.height / 512)
    assert [c.tokens for c in checked] == [425, 255]


@pytest.mark.parametrize(
    "url, code, words",
    [
        ("https://example.com/cat.png", "remote_image_url", "remote image URLs are not accepted"),
        ("file:///etc/passwd", "remote_image_url", "data: URL"),
        ("data:image/svg+xml;base64,PHN2Zy8+", "unsupported_image_type", "'image/svg+xml' is not accepted"),
        ("data:image/png,rawbytes", "invalid_image", "data:<type>;base64"),
        ("data:image/png;base64,@@not-base64@@", "invalid_image", "not valid base64"),
    ],
)
def test_bad_urls_are_refused_naming_the_part(url, code, words):
    error = refused(body_with(url))
    assert error.code == code and words in error.message
    assert error.param == "messages[1].content[1]"


def test_type_must_match_the_bytes_and_the_bytes_must_decode():
    png = image_bytes(32, 32)
    assert refused(body_with(data_url(png, "image/jpeg"))).code == "image_type_mismatch"
    assert refused(body_with(data_url(png[: len(png) // 2]))).code == "undecodable_image"
    assert refused(body_with(data_url(b"\x89PNG\r\n\x1a\n" + b"\0" * 40))).code == "undecodable_image"


def test_size_pixel_and_count_limits():
    png = image_bytes(300, 200)
    assert refused(body_with(data_url(png)), ImageLimits(max_bytes=len(png) - 1)).code == "image_too_large"
    assert refused(body_with(data_url(png)), ImageLimits(max_pixels=300 * 200 - 1)).code == "image_too_large"
    check_images(body_with(data_url(png)), ImageLimits(max_bytes=len(png), max_pixels=300 * 200))
    error = refused(body_with(*[data_url(image_bytes(8, 8))] * 3), ImageLimits(max_images=2))
    assert "at most 2 images" in error.message
    huge = "data:image/png;base64," + "A" * (4 * (1000 // 3 + 1) + 8)  # refused before decoding
    assert refused(body_with(huge), ImageLimits(max_bytes=1000)).code == "image_too_large"


def test_malformed_parts_are_refused():
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "https://x/y.png"}]}]}
    assert "needs {'image_url': {'url'" in refused(body).message
    assert not has_images({"messages": [{"role": "user", "content": "text only"}]})
    assert has_images(body)


def test_images_route_only_to_vision_backends():
    narrowed = vision_only(group(False, True, False, True), "messages[0]")
    assert [s.spec.url for s in narrowed.backends] == ["http://b1", "http://b3"]
    assert narrowed.name == "m" and narrowed.max_tokens == 16
    with pytest.raises(GatewayError) as caught:
        vision_only(group(False, False), "messages[1].content[1]")
    assert caught.value.code == "images_not_supported" and caught.value.status == 400


def test_admission_reserves_image_tokens_and_shares_backend_state():
    text_only = group(False, True)
    body = body_with(data_url(image_bytes(1024, 100)))
    for off_loop in (False, True):
        narrowed, tokens = asyncio.run(admit_images(text_only, body, Settings(), off_loop))
        assert tokens == 85 + 170 * 2 * 1
        assert narrowed.backends == [text_only.backends[1]] and narrowed.backends[0] is text_only.backends[1]
    with pytest.raises(GatewayError) as caught:  # refused as unsupported before decoding a broken image
        asyncio.run(admit_images(group(False), body_with("data:image/png;base64,!!"), Settings(), False))
    assert caught.value.code == "images_not_supported"
