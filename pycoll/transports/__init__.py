"""Transports: how bytes move between two ranks (the layer under the algorithms).

Shared by every transport:

* ``base``: the interface: ``Transport``, ``Channel`` (and its lifecycle), ``Capabilities``,
  ``OpenContext``, ``PeerInfo``, ``ActiveSet``;
* ``matching``: ``Request`` and the tag matcher (any-source receives, mismatch checks);
* ``progress``: the progress engine and its wait policy;
* ``registry``: which transports exist, and the transport of each pair of ranks;
* ``wireup``: lazy dials, the job-membership handshake and the acceptor (tcp and verbs);
* ``netif``: interface and device choice by name, socket tuning.

The transports, each with the same shape (a channel and a transport, plus its own extras):
``shm/``, ``tcp/``, ``verbs/``, and the single modules ``inproc`` (threads of one process)
and ``cuda_ipc`` (shm plus device memory).
"""
