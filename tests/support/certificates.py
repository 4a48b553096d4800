"""A throwaway CA, a server certificate for 127.0.0.1 and client certificates, made with the
openssl command."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from streaming.services import TlsFiles

_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")
# A key's password reaches openssl through its environment: a command line is visible to ps.
_KEY_PASSWORD_VARIABLE = "QUOTASTREAM_TEST_KEY_PASSWORD"


def make_certificates(folder: Path) -> TlsFiles:
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    _openssl(
        *("req", "-x509", *_EC_KEY, "-nodes", "-keyout", ca_key, "-out", ca),
        *("-days", "2", "-subj", "/CN=test CA"),
    )
    cert, key = folder / "server.pem", folder / "server.key"
    server_extensions = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    _sign(ca, cert, key, "/CN=127.0.0.1", server_extensions)
    return TlsFiles(cert=cert, key=key, ca=ca)


def make_client_certificate(server: TlsFiles, name: str, key_password: str) -> TlsFiles:
    """A client certificate signed by ``server``'s CA, beside its files, with its key encrypted
    by ``key_password`` (what kafka-python's ``ssl_password`` unlocks)."""
    folder = server.ca.parent
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    _sign(server.ca, cert, key, f"/CN={name}", "extendedKeyUsage=clientAuth\n", key_password)
    return TlsFiles(cert=cert, key=key, ca=server.ca)


def _sign(
    ca: Path, cert: Path, key: Path, subject: str, extensions: str, key_password: str | None = None
) -> None:
    """A new key and ``cert`` for it, signed by ``ca`` (its key beside it as ``ca.key``)."""
    request, extension_file = cert.with_suffix(".csr"), cert.with_suffix(".ext")
    extension_file.write_text(extensions)
    protection: tuple[str, ...] = ("-nodes",)
    environment = None
    if key_password is not None:
        protection = ("-passout", f"env:{_KEY_PASSWORD_VARIABLE}")
        environment = {**os.environ, _KEY_PASSWORD_VARIABLE: key_password}
    _openssl(
        *("req", *_EC_KEY),
        *protection,
        *("-keyout", key, "-out", request, "-subj", subject),
        environment=environment,
    )
    _openssl(
        *("x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca.with_name("ca.key")),
        *("-CAcreateserial", "-out", cert, "-days", "2", "-extfile", extension_file),
    )


def _openssl(*arguments: str | Path, environment: dict[str, str] | None = None) -> None:
    subprocess.run(
        ["openssl", *map(str, arguments)], check=True, capture_output=True, env=environment
    )
