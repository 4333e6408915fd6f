"""TCP transport: one or more sockets per pair, works between hosts.

* ``transport``: ``TcpTransport``: probe, lazy connections, progress, the engine's fds;
* ``channel``: ``TcpChannel``: frames, striping over the pair's sockets, farewells.

The dials and handshake are ``transports.wireup``'s, the interface choice
``transports.netif``'s (verbs uses both too).
"""
