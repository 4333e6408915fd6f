"""TCP transport: one or more sockets per pair, works between hosts.

* ``transport``: ``TcpTransport``: probe, lazy connections, progress, the engine's fds;
* ``channel``: ``TcpChannel``: frames, striping over the pair's sockets, farewells;
* ``tls``: ``TlsChannel``: the same over TLS sockets (``PYCOLL_TLS_CERT/KEY/CA``).

The dials and handshake are ``transports.wireup``'s, the interface choice
``transports.netif``'s (verbs uses both too).
"""
