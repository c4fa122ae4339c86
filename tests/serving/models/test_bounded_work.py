"""Bounded work per request on the model server: an image's pixels are counted from its header before it
is decoded, large bodies (infer and /recommend) are parsed, decoded and tokenized off the event loop (so
the server keeps answering others meanwhile), and an unknown model is refused before its body is read."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading

import httpx
import numpy as np
import pytest
from PIL import ImageFile

from serving.models.kinds.encoders import ClipEncoder
from serving.models.protocols import app, binary

HOLD_LIMIT_S = 60  # a held stage gives up after this, so a blocked event loop fails the test, not hangs it


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


class Hold:
    """Holds one stage of the server's work until the test has had `/v2/health/live` answered, and
    records whether that happened while the stage was held (it cannot while the stage blocks the
    event loop: the hold then gives up after HOLD_LIMIT_S and the answer comes after)."""

    def __init__(self):
        self.entered = threading.Event()
        self.health_answered = threading.Event()
        self.answered_while_held: bool | None = None

    def wrap(self, stage):
        def held(*args, **kwargs):
            self.entered.set()
            self.answered_while_held = self.health_answered.wait(HOLD_LIMIT_S)
            return stage(*args, **kwargs)

        return held


def text_body(size: int) -> bytes:
    return json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a" * size]}]}).encode()


@pytest.mark.parametrize("stage", ["decoding", "tokenizing"])
def test_health_answers_while_a_large_body_is_decoded_or_tokenized(clip_server, monkeypatch, stage):
    """Before: a 20 MB clip_text string was parsed, decoded and tokenized on the event loop, and
    /v2/health/live waited 6.2 s behind it."""
    hold = Hold()
    if stage == "decoding":
        monkeypatch.setattr(binary, "decode_inputs", hold.wrap(binary.decode_inputs))
    else:
        monkeypatch.setattr(ClipEncoder, "prepare", hold.wrap(ClipEncoder.prepare))
    answers = {}

    def send_large():
        url = f"{clip_server.url}/v2/models/clip_text/infer"
        answers["large"] = httpx.post(url, content=text_body(2_000_000), timeout=HOLD_LIMIT_S * 3)

    sender = threading.Thread(target=send_large)
    sender.start()
    assert hold.entered.wait(HOLD_LIMIT_S)
    answers["health"] = httpx.get(f"{clip_server.url}/v2/health/live", timeout=HOLD_LIMIT_S * 2)
    hold.health_answered.set()
    sender.join()
    assert answers["health"].status_code == 200
    assert hold.answered_while_held, f"/v2/health/live waited for the {stage} of a large body"
    assert answers["large"].status_code == 200, answers["large"].text
    assert np.array(answers["large"].json()["outputs"][0]["data"]).shape[0] > 0


def test_health_answers_while_a_large_recommend_body_is_parsed(clip_server, monkeypatch):
    """Before: FastAPI parsed and validated `/recommend` bodies (up to max_body_bytes) on the event loop."""
    hold = Hold()
    monkeypatch.setattr(app, "read_recommend_body", hold.wrap(app.read_recommend_body))
    body = json.dumps({"user_id": 1, "context": {"exclude_item_ids": list(range(200_000))}})
    answers = {}

    def send_large():
        answers["large"] = httpx.post(f"{clip_server.url}/recommend", content=body, timeout=HOLD_LIMIT_S * 3)

    sender = threading.Thread(target=send_large)
    sender.start()
    assert hold.entered.wait(HOLD_LIMIT_S)
    answers["health"] = httpx.get(f"{clip_server.url}/v2/health/live", timeout=HOLD_LIMIT_S * 2)
    hold.health_answered.set()
    sender.join()
    assert answers["health"].status_code == 200
    assert hold.answered_while_held, "/v2/health/live waited for the parsing of a large /recommend body"
    # parsed and valid: this server has no recommend model, which is what the answer says
    assert answers["large"].status_code in (404, 503) and answers["large"].json()["error"], answers["large"].text


def test_an_unknown_model_is_refused_before_its_body_is_read(clip_server):
    """Before: a body (up to max_body_bytes) was read and parsed before the model's name was looked up.
    Here the body is never sent: a 404 arriving at all shows it was not waited for."""
    with socket.create_connection(("127.0.0.1", clip_server.port), timeout=HOLD_LIMIT_S) as connection:
        head = (
            "POST /v2/models/no-such-model/infer HTTP/1.1\r\nHost: test\r\n"
            "Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n{"
        )
        connection.sendall(head.encode())
        reply = connection.recv(65536).decode(errors="replace")
    assert reply.startswith("HTTP/1.1 404"), reply
    assert "no-such-model" in reply
