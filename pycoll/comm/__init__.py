"""Communicators: the object a user holds and the collectives it offers.

* ``communicator``: construction (``bootstrap``), groups, introspection, teardown;
* ``collectives``, ``fused``, ``variants``: what each collective computes, as a body over an
  algorithm;
* ``persistent``: plans bound to buffers (``allreduce_init`` and every other ``*_init``);
* ``planning``: argument checks, memory-type routing and algorithm choice before any byte
  moves;
* ``bootstrap``: the store round, the rank table and the lazily opened channels;
* ``topology``: which ranks share a node.
"""
