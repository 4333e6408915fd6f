"""Transports: how bytes move between two ranks (the layer under the algorithms).

Shared by every transport:

* ``base``: the interface: ``Transport``, ``Channel`` (and its lifecycle), ``Capabilities``,
  ``OpenContext``, ``PeerInfo``, ``ActiveSet``;
* ``matching``: ``Request`` and the tag matcher (any-source receives, mismatch checks);
* ``progress``: the progress engine and its wait policy;
* ``registry``: which transports exist, and the transport of each pair of ranks;
* ``wireup``: lazy dials, the job-membership handshake and the acceptor (tcp and verbs);
* ``netif``: interface and device choice by name, socket tuning.

The transports, each a folder with the same file names (``transport.py``, ``channel.py``,
plus its own extras): ``shm/``, ``tcp/``, ``verbs/``, ``inproc/`` (threads of one process);
and the single module ``cuda_ipc`` (shm plus device memory). Nothing outside a transport's
folder and the registry names it: pycoll decides from its ``Capabilities``.
"""
