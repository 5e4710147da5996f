"""The CA and server certificate `corral up` generates (`corral.stack.tls`): kept across restarts,
renewed when they would expire or miss a host, keys private."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

from cryptography import x509

from corral.stack import tls


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_generate_writes_a_ca_and_a_server_certificate_it_signed(tmp_path: Path) -> None:
    files = tls.generate(tmp_path / "tls", hosts=["127.0.0.1", "localhost"])
    ca, server = _cert(files.ca), _cert(files.cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert server.issuer == ca.subject
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert stat.S_IMODE(files.directory.stat().st_mode) == 0o700
    for key in (files.ca_key, files.key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_a_restart_keeps_the_ca_and_the_certificate(tmp_path: Path) -> None:
    first = tls.generate(tmp_path / "tls", hosts=["127.0.0.1"])
    before = (first.ca.read_bytes(), first.cert.read_bytes(), first.key.read_bytes())
    again = tls.generate(tmp_path / "tls", hosts=["127.0.0.1"])
    assert (again.ca.read_bytes(), again.cert.read_bytes(), again.key.read_bytes()) == before


def test_a_new_host_or_a_close_expiry_renews_the_server_certificate_not_the_ca(tmp_path: Path) -> None:
    first = tls.generate(tmp_path / "tls", hosts=["127.0.0.1"])
    ca, cert = first.ca.read_bytes(), first.cert.read_bytes()
    tls.generate(tmp_path / "tls", hosts=["127.0.0.1", "gpu-head.example"])
    assert first.ca.read_bytes() == ca and first.cert.read_bytes() != cert
    cert = first.cert.read_bytes()
    later = dt.datetime.now(dt.UTC) + tls.SERVER_VALIDITY - tls.RENEW_BEFORE + dt.timedelta(days=1)
    tls.generate(tmp_path / "tls", hosts=["127.0.0.1"], now=later)
    assert first.ca.read_bytes() == ca and first.cert.read_bytes() != cert


def test_the_server_block_requires_tls_before_anything_else(tmp_path: Path) -> None:
    block = tls.generate(tmp_path / "tls", hosts=["127.0.0.1"]).server_block()
    assert "handshake_first: true" in block and str(tmp_path / "tls" / "server.pem") in block
