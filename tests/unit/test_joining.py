"""Join tokens and the node registry (shared/joining.py): proofs, expiry, uses, revocation."""

from __future__ import annotations

import pytest

from shared import auth, joining


def _keys() -> tuple[str, str]:
    return auth.Credentials.generate("worker-x").nkey, auth.Credentials.generate("inference-x").nkey


def _request(token: str, node: str = "n1") -> joining.JoinRequest:
    w, i = _keys()
    return joining.make_request(token, node, w, i)


def test_a_good_token_admits_once_and_the_secret_is_not_in_the_request(tmp_path):
    token_id, token = joining.create_token(tmp_path, now=100.0)
    req = _request(token)
    assert token.split("-", 2)[2] not in joining.encode_request(req).decode()
    joined = joining.accept(tmp_path, joining.decode_request(joining.encode_request(req)), now=101.0)
    assert (joined.node, joined.token_id) == ("n1", token_id)
    assert list(joining.joined_nodes(tmp_path)) == ["n1"]
    with pytest.raises(joining.JoinError, match="used-up"):
        joining.accept(tmp_path, _request(token, "n2"), now=102.0)
    assert list(joining.joined_nodes(tmp_path)) == ["n1"]


def test_expired_revoked_and_forged_requests_change_nothing(tmp_path):
    _, token = joining.create_token(tmp_path, now=0.0, ttl_s=10.0, uses=5)
    with pytest.raises(joining.JoinError, match="expired"):
        joining.accept(tmp_path, _request(token), now=11.0)
    req = _request(token)
    forged = joining.JoinRequest(req.token_id, "n9", req.worker_nkey, req.inference_nkey, req.proof)
    with pytest.raises(joining.JoinError, match="invalid"):
        joining.accept(tmp_path, forged, now=1.0)  # the proof binds the node and keys
    other_keys = joining.JoinRequest(req.token_id, req.node, _keys()[0], req.inference_nkey, req.proof)
    with pytest.raises(joining.JoinError, match="invalid"):
        joining.accept(tmp_path, other_keys, now=1.0)
    joining.revoke_token(tmp_path, req.token_id)
    with pytest.raises(joining.JoinError, match="revoked"):
        joining.accept(tmp_path, req, now=1.0)
    assert joining.joined_nodes(tmp_path) == {}


def test_a_joined_name_is_taken_until_removed(tmp_path):
    _, token = joining.create_token(tmp_path, now=0.0, uses=3)
    first = _request(token)
    joining.accept(tmp_path, first, now=1.0)
    joining.accept(tmp_path, first, now=2.0)  # the same keys again: nothing new, no use spent
    assert joining.list_tokens(tmp_path, now=3.0)[0]["uses_left"] == 2
    with pytest.raises(joining.JoinError, match="already joined"):
        joining.accept(tmp_path, _request(token), now=3.0)
    with pytest.raises(joining.JoinError, match="already joined"):
        joining.accept(tmp_path, _request(token, "manager-host"), now=3.0, reserved=frozenset({"manager-host"}))
    joining.remove_node(tmp_path, "n1")
    joining.accept(tmp_path, _request(token), now=4.0)
    assert list(joining.joined_nodes(tmp_path)) == ["n1"]


@pytest.mark.parametrize("bad", [b"", b"{}", b"[1]", b'{"token_id": 1}'])
def test_malformed_requests(bad):
    with pytest.raises(joining.JoinError, match="malformed"):
        joining.decode_request(bad)


def test_tokens_must_look_like_tokens():
    for bad in ("", "DQJ1-abc", "XXX1-abc-0123456789abcdef", "DQJ1-a$c-0123456789abcdef"):
        with pytest.raises(joining.JoinError, match="not a join token"):
            joining.parse_token(bad)


def test_a_pinned_token_carries_the_ca_digest_and_the_same_id_and_secret(tmp_path):
    token_id, plain = joining.create_token(tmp_path, now=0.0)
    digest = "ab" * 32
    pinned = joining.pin_token(plain, digest)
    assert pinned.startswith(f"DQJ2-{digest}-{token_id}-")
    assert joining.parse_token(pinned) == joining.parse_token(plain)
    assert (joining.token_pin(pinned), joining.token_pin(plain)) == (digest, None)
    # The pinned token's proof is the plain one's: the control plane admits it as it is.
    w, i = auth.Credentials.generate("worker-n1"), auth.Credentials.generate("inference-n1")
    request = joining.make_request(pinned, "n1", w.nkey, i.nkey)
    assert joining.accept(tmp_path, request, now=1.0).node == "n1"


def test_a_pin_must_be_a_sha256_digest():
    _, plain = joining.new_token(joining.empty_registry(), now=0.0)
    for bad in ("ab" * 31, "AB" * 32, "zz" * 32):
        with pytest.raises(joining.JoinError):
            joining.pin_token(plain, bad)
        with pytest.raises(joining.JoinError, match="not a join token"):
            joining.parse_token(f"DQJ2-{bad}-{plain[5:]}")
