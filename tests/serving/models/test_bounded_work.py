"""Bounded work per request on the model server: an image's pixels are counted from its header before it
is decoded."""

from __future__ import annotations

import base64
import io

import httpx
import pytest
from PIL import ImageFile


def png_of(width: int, height: int) -> bytes:
    """A PNG of this canvas: one bit per pixel, so a 9000x9000 one is a small file and a small array."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("1", (width, height)).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def image_body(*images: bytes) -> dict:
    data = [base64.b64encode(image).decode() for image in images]
    tensor = {"name": "image", "datatype": "BYTES", "shape": [len(data)], "data": data}
    return {"inputs": [{**tensor, "parameters": {"binary_encoding": "base64"}}]}


@pytest.fixture
def decoded_sizes(monkeypatch) -> list[tuple[int, int]]:
    """The size of every image PIL decodes in this process (the server runs in it)."""
    sizes: list[tuple[int, int]] = []
    load = ImageFile.ImageFile.load

    def recording_load(image):
        sizes.append(image.size)
        return load(image)

    monkeypatch.setattr(ImageFile.ImageFile, "load", recording_load)
    return sizes


def test_an_image_over_the_pixel_limit_is_refused_before_it_is_decoded(clip_server, decoded_sizes):
    """Before: a 9000x9000 PNG (small on the wire) was decoded to 243 MB of RGB on the event loop."""
    huge = png_of(9000, 9000)
    answer = httpx.post(f"{clip_server.url}/v2/models/clip_image/infer", json=image_body(png_of(64, 64), huge))
    assert answer.status_code == 413, answer.text[:300]
    error = answer.json()["error"]
    assert "'image'[1]" in error and "9000x9000" in error and "max_image_pixels" in error, error
    assert (9000, 9000) not in decoded_sizes
    served = httpx.post(f"{clip_server.url}/v2/models/clip_image/infer", json=image_body(png_of(64, 64)))
    assert served.status_code == 200, served.text
    assert (64, 64) in decoded_sizes  # images within the limit are decoded (the recording works)
