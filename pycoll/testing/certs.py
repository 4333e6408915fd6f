"""Certificates for TLS tests and benchmarks, made with the ``openssl`` command line tool.

``make_job_certificates(folder, names)`` writes a fresh CA and one certificate and key per name
signed by it (EC P-256, TLS client and server use), the files ``PYCOLL_TLS_CERT/KEY/CA`` take.
Nothing here is for production: docs/security.md shows the same commands for real jobs.
"""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

_LEAF_EXTENSIONS = ("basicConstraints = CA:FALSE\n"
                    "keyUsage = digitalSignature\n"
                    "extendedKeyUsage = serverAuth, clientAuth\n")
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl_available() -> bool:
    return shutil.which("openssl") is not None


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def make_job_certificates(folder: Path, names: Sequence[str] = ("rank",),
                          ca_name: str = "pycoll-test-ca") -> dict[str, dict[str, str]]:
    """A CA and a certificate per name in ``folder``; name -> the variables that select it
    (``PYCOLL_TLS_CERT``, ``PYCOLL_TLS_KEY``, ``PYCOLL_TLS_CA``)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    _openssl("req", "-x509", *_KEY, "-keyout", ca_key, "-out", ca, "-days", "2",
             "-subj", f"/CN={ca_name}")
    ext = folder / "leaf.cnf"
    ext.write_text(_LEAF_EXTENSIONS)
    out = {}
    for name in names:
        cert, key, csr = folder / f"{name}.pem", folder / f"{name}.key", folder / f"{name}.csr"
        _openssl("req", *_KEY, "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
        _openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
                 "-out", cert, "-days", "2", "-extfile", ext)
        out[name] = {"PYCOLL_TLS_CERT": str(cert), "PYCOLL_TLS_KEY": str(key),
                     "PYCOLL_TLS_CA": str(ca)}
    return out
