"""TLS for a job's sockets: the certificate files, the contexts, failures in plain words.

Opt-in per job with three files, as Gloo's ``TCP_TLS`` takes them: ``PYCOLL_TLS_CERT`` (this
process's certificate chain, PEM), ``PYCOLL_TLS_KEY`` (its private key) and ``PYCOLL_TLS_CA``
(the CA that signed every certificate of the job). All three set: the store and every tcp
data connection speak TLS 1.3 with mutual authentication; none set: plain sockets, as
before; some: an error naming the missing ones.

The store owns this module because it is the lowest layer: the tcp transport uses the same
contexts (``pycoll.envvars.env_tls`` reads them for pycoll).

Peers are dialled by IP address, and a job's certificates rarely name the addresses the
ranks happen to get, so the host name is not checked (``check_hostname`` off, as Gloo does):
the CA is the job's own and pins its members, and inside the TLS stream every connection
still proves the job secret (the store's challenge-response, the data ports' HMAC hello).
A CA that signs certificates for more than one job lets those jobs' processes past TLS, and
only the job secret then keeps them apart.
"""
from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["TLS_VARIABLES", "TlsConfigError", "TlsFiles", "describe_tls_failure",
           "resolve_tls", "tls_from_env"]

ENV_CERT, ENV_KEY, ENV_CA = "PYCOLL_TLS_CERT", "PYCOLL_TLS_KEY", "PYCOLL_TLS_CA"
TLS_VARIABLES = (ENV_CERT, ENV_KEY, ENV_CA)


class TlsConfigError(ValueError):
    """The TLS variables or files are unusable: some variables set but not all, a file that
    does not exist, a key that does not match its certificate."""


@dataclass(frozen=True)
class TlsFiles:
    """The three PEM files of one process: its certificate chain, its key, the job's CA."""

    cert: str
    key: str
    ca: str

    def server_context(self) -> ssl.SSLContext:
        """For the accepting side (the store, a data port): asks for the peer's certificate
        too. No session tickets: connections live as long as the job, none is resumed, and
        tickets would be bytes after the handshake that the reader must drain."""
        ctx = self._context(ssl.PROTOCOL_TLS_SERVER)
        ctx.num_tickets = 0
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """For the dialing side (a store client, a rank dialing a data port)."""
        return self._context(ssl.PROTOCOL_TLS_CLIENT)

    def _context(self, protocol: int) -> ssl.SSLContext:
        ctx = ssl.SSLContext(protocol)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.check_hostname = False          # the CA pins the job's members (module docstring)
        ctx.verify_mode = ssl.CERT_REQUIRED  # mutual: each side checks the other's chain
        try:
            ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as e:
            raise TlsConfigError(
                f"cannot load the certificate {ENV_CERT}={self.cert!r} with the key "
                f"{ENV_KEY}={self.key!r}: {e}; both must be readable PEM files and the key "
                "must be the certificate's") from None
        try:
            ctx.load_verify_locations(cafile=self.ca)
        except (OSError, ssl.SSLError) as e:
            raise TlsConfigError(f"cannot load the CA {ENV_CA}={self.ca!r}: {e}; it must be a "
                                 "readable PEM file of the CA that signed the job's "
                                 "certificates") from None
        return ctx


def tls_from_env(environ: Mapping[str, str] | None = None) -> TlsFiles | None:
    """The job's TLS files from ``PYCOLL_TLS_CERT/KEY/CA``; None when none is set; a
    ``TlsConfigError`` naming what is missing when only some are, or a file is absent."""
    env = os.environ if environ is None else environ
    values = {name: (env.get(name) or "").strip() for name in TLS_VARIABLES}
    given = [name for name, v in values.items() if v]
    if not given:
        return None
    missing = [name for name in TLS_VARIABLES if name not in given]
    if missing:
        raise TlsConfigError(
            f"TLS needs all of {', '.join(TLS_VARIABLES)}: {', '.join(given)} set but "
            f"{', '.join(missing)} not; set all three (TLS on the store and on tcp) or none")
    for name, path in values.items():
        if not os.path.isfile(path):
            raise TlsConfigError(f"{name}={path!r}: no such file")
    return TlsFiles(values[ENV_CERT], values[ENV_KEY], values[ENV_CA])


def resolve_tls(tls: TlsFiles | bool | None) -> TlsFiles | None:
    """Precedence shared by the store's server and client: ``TlsFiles`` as given, ``None``
    from the environment, ``False`` plain sockets whatever the environment says."""
    if tls is None:
        return tls_from_env()
    if tls is False or tls is True:
        if tls:
            raise TlsConfigError("tls=True: pass TlsFiles(cert, key, ca), or None to read "
                                 f"{', '.join(TLS_VARIABLES)}")
        return None
    return tls


def describe_tls_failure(error: BaseException) -> str:
    """What a failed handshake means and what to check, in a sentence."""
    text = str(error)
    reason = getattr(error, "reason", None) or text
    if "CERTIFICATE_VERIFY_FAILED" in text or reason == "CERTIFICATE_VERIFY_FAILED":
        return (f"TLS handshake failed: the peer's certificate is not signed by this "
                f"process's CA ({ENV_CA}) ({reason}); every process of the job needs a "
                f"certificate from the same CA")
    if "UNKNOWN_CA" in text or "CERTIFICATE_REQUIRED" in text or "BAD_CERTIFICATE" in text:
        return (f"TLS handshake failed: the peer refused this process's certificate "
                f"({reason}); {ENV_CERT} must be signed by the CA the peer trusts ({ENV_CA})")
    if "WRONG_VERSION_NUMBER" in text or "UNSUPPORTED_PROTOCOL" in text:
        return (f"TLS handshake failed: the peer does not speak TLS 1.3 ({reason}); set "
                f"{', '.join(TLS_VARIABLES)} on every process of the job or on none")
    return f"TLS handshake failed ({reason}); check {', '.join(TLS_VARIABLES)}"
