"""``python -m rendezvous serve --host H --port P [--token-file F]``: a standalone server.

Prints ``rendezvous listening on HOST:PORT`` (one flushed line, so a launcher can read the
real port when it asked for 0) and exits 0 on SIGINT/SIGTERM after closing every connection.
The token is read from a file rather than the command line because argv is world-readable
in ``ps``; without ``--token-file``, ``$PYCOLL_TOKEN`` is used if set.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence

from .protocol import DEFAULT_MAX_KEY_SIZE, DEFAULT_MAX_VALUE_SIZE
from .server import StoreServer


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rendezvous", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run a standalone rendezvous store server")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=0, help="port to bind (0 = pick a free one)")
    s.add_argument("--token-file",
                   help="file holding the job token (default: $PYCOLL_TOKEN, else no auth)")
    s.add_argument("--max-key-size", type=int, default=DEFAULT_MAX_KEY_SIZE)
    s.add_argument("--max-value-size", type=int, default=DEFAULT_MAX_VALUE_SIZE)
    s.add_argument("--handshake-timeout", type=float, default=10.0,
                   help="seconds a new connection gets to authenticate (default 10)")
    s.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(name)s %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    token: str | None = None
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as f:
            token = f.read().strip()
        if not token:
            print(f"error: token file {args.token_file} is empty", file=sys.stderr)
            return 2
    server = StoreServer(
        args.host,
        args.port,
        token=token,
        max_key_size=args.max_key_size,
        max_value_size=args.max_value_size,
        handshake_timeout=args.handshake_timeout,
    )

    def _stop(signum: int, frame: object) -> None:
        server.stop()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    print(f"rendezvous listening on {server.address}", flush=True)
    logging.getLogger("rendezvous.server").info(
        "serving on %s (auth %s)", server.address, "on" if server.auth_required else "off"
    )
    server.serve_forever()
    logging.getLogger("rendezvous.server").info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
