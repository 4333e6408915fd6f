"""InfiniBand/RoCE verbs transport (pyverbs): RC queue pairs per peer, eager with credits,
zero-copy rendezvous.

* ``transport``: ``VerbsTransport``: probe, shared registrations, lazy setup, progress;
* ``channel``: ``VerbsChannel``: the eager/rendezvous/put protocol and completion dispatch;
* ``queue_pairs``: ``QueuePairs``: queue pairs, rings, credits, the setup socket, teardown;
* ``wire``: message header and kinds, the address exchange, work-request ids, constants;
* ``device``: the device and port choice, queue-pair helpers, the registration cache.
"""
