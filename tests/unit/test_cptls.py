"""The control plane's client TLS settings and files (services/cli/cptls.py), and the URLs that carry a CA."""

from __future__ import annotations

import hashlib
import json
import shutil
import ssl
import subprocess

import pytest

from services.cli import cptls
from services.cli.common import CliError
from shared import auth, tlspin

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")


def test_tls_is_on_beyond_loopback_unless_set():
    assert not cptls.enabled({"listen": "127.0.0.1", "tls": None})
    assert not cptls.enabled({"listen": "localhost", "tls": None})
    assert cptls.enabled({"listen": "0.0.0.0", "tls": None})
    assert cptls.enabled({"listen": "10.0.0.1", "tls": None})
    assert cptls.enabled({"listen": "127.0.0.1", "tls": True})
    assert not cptls.enabled({"listen": "0.0.0.0", "tls": False})


def _san(pem_file) -> str:
    r = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(pem_file)],
                       capture_output=True, text=True, check=True)
    return r.stdout


@needs_openssl
def test_a_private_ca_is_made_once_and_the_server_certificate_names_what_nodes_use(tmp_path):
    cfg = {"listen": "0.0.0.0", "tls": None, "advertise": "tls://cp.example.internal:4222",
           "tls_names": "10.9.8.7, other.example"}
    tls = cptls.setup(tmp_path, cfg)
    assert tls is not None
    for f in (tmp_path / "tls").iterdir():
        assert f.stat().st_mode & 0o077 == 0, f
    ca_der = ssl.PEM_cert_to_DER_cert(tls.ca.read_text())
    assert tls.digest == hashlib.sha256(ca_der).hexdigest() == cptls.pinned_digest(tmp_path)
    chain = tlspin.certificates(tls.chain.read_text())
    assert len(chain) == 2 and chain[1] == ca_der  # the server shows its CA after its certificate
    san = _san(tmp_path / "tls" / "server.pem")
    for name in ("IP Address:127.0.0.1", "DNS:localhost", "DNS:cp.example.internal", "IP Address:10.9.8.7",
                 "DNS:other.example"):
        assert name in san, san
    # The certificate verifies against the CA alone.
    ctx = ssl.create_default_context(cafile=str(tls.ca))
    assert ctx.cert_store_stats()["x509_ca"] == 1
    again = cptls.setup(tmp_path, cfg)
    assert again is not None and again.digest == tls.digest  # restarts keep the CA: tokens stay good
    assert cptls.setup(tmp_path, {**cfg, "tls": False}) is None
    assert cptls.pinned_digest(tmp_path) is None  # tokens made now pin nothing


def test_given_files_must_be_complete_and_the_key_private(tmp_path):
    cert, key, ca = (tmp_path / n for n in ("c.pem", "k.pem", "ca.pem"))
    for f in (cert, key, ca):
        f.write_text("x")
    with pytest.raises(CliError, match="needs all of tls_cert, tls_key, tls_ca"):
        cptls.setup(tmp_path, {"tls": True, "tls_cert": str(cert)})
    key.chmod(0o644)
    with pytest.raises(CliError, match="readable by others"):
        cptls.setup(tmp_path, {"tls": True, "tls_cert": str(cert), "tls_key": str(key), "tls_ca": str(ca)})
    with pytest.raises(CliError, match="one CA on every member"):
        cptls.setup(tmp_path, {"tls": True, "routes": "nats-route://a:6222"})


def test_a_url_carries_its_ca_through_credentials_and_logs_leave_it_out(tmp_path):
    creds = auth.Credentials.generate("client")
    creds_file = tmp_path / "client.creds"
    creds_file.write_text(json.dumps({"identity": "client", "nkey": creds.nkey, "seed": creds.seed,
                                      "inbox_prefix": creds.inbox_prefix}))
    ca = tmp_path / "ca.pem"
    url = auth.with_tls_ca("nats://a:4222,nats://b:4222", ca)
    assert url.startswith("tls://a:4222?ca=") and ",tls://b:4222?ca=" in url
    both = auth.with_credentials(url, creds_file)
    assert auth.tls_ca_of(both) == str(ca) and auth.creds_of(both) == str(creds_file.resolve())
    assert auth.redact(both) == "tls://a:4222,tls://b:4222"
    assert auth.without_tls_ca(url) == "tls://a:4222,tls://b:4222"
    assert auth.tls_ca_of("tls://a:4222") is None and auth.tls_context("tls://a:4222") is None
    with pytest.raises(auth.AuthError, match="different CA files"):
        auth.tls_ca_of(f"{auth.with_tls_ca('tls://a:1', ca)},{auth.with_tls_ca('tls://b:1', tmp_path / 'x.pem')}")
    with pytest.raises(auth.AuthError, match="CA file"):
        auth.tls_context(url)  # no such file yet


def test_a_digest_is_of_the_first_certificate_of_a_pem_text():
    with pytest.raises(tlspin.PinError):
        tlspin.pem_digest("no certificate here")


def test_a_failed_join_says_what_to_do_about_its_certificate():
    from services.cli import hosts

    verify = "SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
    assert "accept_joins" in hosts._why("connection refused", pinned=True)
    assert "pins none" in hosts._why(verify + "self-signed certificate in certificate chain", pinned=False)
    assert "tls_names" in hosts._why(verify + "IP address mismatch, certificate is not valid for '10.0.0.9'",
                                     pinned=True)
    assert "not signed by the CA" in hosts._why(verify + "unable to get local issuer certificate", pinned=True)
