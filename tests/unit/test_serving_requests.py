"""What the inference serving mode accepts as a request body and a --serve address, and what it refuses."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("starlette")
from services.inference.serving import MAX_SEED, RequestError, parse_addr, parse_request  # noqa: E402


def test_a_request_stands_for_images_and_a_seed():
    assert parse_request(b"", 8) == (1, 0)
    assert parse_request(b"{}", 8) == (1, 0)
    assert parse_request(b'{"images": 8, "seed": 42}', 8) == (8, 42)


@pytest.mark.parametrize("body, words", [
    (b"nope", "not JSON"),
    (b"[1]", "JSON object"),
    (b'{"images": 9}', "from 1 to 8"),
    (b'{"images": 0}', "from 1 to 8"),
    (b'{"images": true}', "from 1 to 8"),
    (b'{"images": 1.5}', "from 1 to 8"),
    (b'{"seed": -1}', "seed must be"),
    (b'{"images": 1, "tensor": []}', "unknown field(s): tensor"),
])
def test_a_bad_request_is_one_line(body, words):
    with pytest.raises(RequestError) as e:
        parse_request(body, 8)
    assert words in str(e.value) and "\n" not in str(e.value)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=64),
                 st.dictionaries(st.sampled_from(["images", "seed", "x"]),
                                 st.one_of(st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=5),
                                           st.none(), st.booleans()), max_size=3)
                 .map(lambda d: json.dumps(d).encode())))
def test_any_body_gives_a_bounded_request_or_a_request_error(body):
    try:
        images, seed = parse_request(body, 8)
    except RequestError as e:
        assert "\n" not in str(e)
        return
    assert 1 <= images <= 8 and 0 <= seed <= MAX_SEED


def test_serve_addresses():
    assert parse_addr("8080") == ("0.0.0.0", 8080)
    assert parse_addr("127.0.0.1:9000") == ("127.0.0.1", 9000)
    for bad in ("", "host:", "host:0", "host:70000", "x"):
        with pytest.raises(ValueError, match="--serve"):
            parse_addr(bad)
