"""TCP transport: one or more sockets per pair, works between hosts. ``channel``: the channel and transport (setup is ``transports.wireup``, addresses ``transports.netif``)."""
