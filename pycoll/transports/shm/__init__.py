"""Shared-memory transport (same host): an inbox segment per ordered pair, eager slots,
cross-memory attach for large messages.

* ``transport``: ``ShmTransport``: probe, lazy inboxes, unlinking, progress;
* ``channel``: ``ShmChannel``: the slot protocols (eager, rendezvous, fragments, puts);
* ``segment``: the inbox layout, settings, and the files in /dev/shm;
* ``cma``: cross-memory attach and whether a peer process has exited.
"""
