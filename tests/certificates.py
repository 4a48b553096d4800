"""A throwaway CA and a server certificate for 127.0.0.1, made with the openssl command."""

from __future__ import annotations

import subprocess
from pathlib import Path

from streaming.services import TlsFiles


def make_certificates(folder: Path) -> TlsFiles:
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    cert, key, request = folder / "server.pem", folder / "server.key", folder / "server.csr"
    extensions = folder / "server.ext"
    extensions.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for command in (
        ["req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=test CA"],
        ["req", *ec, "-keyout", key, "-out", request, "-subj", "/CN=127.0.0.1"],
        [
            *["x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial"],
            *["-out", cert, "-days", "2", "-extfile", extensions],
        ],
    ):
        subprocess.run(["openssl", *map(str, command)], check=True, capture_output=True)
    return TlsFiles(cert=cert, key=key, ca=ca)
