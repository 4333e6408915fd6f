"""Buffers: what a rank computes on, below every transport.

* ``memory``: ``MemRef``, the address, length and memory type that cross the transport
  boundary;
* ``tensors``: a user's object (numpy, torch, buffer protocol, DLPack, CUDA array interface)
  classified and validated into a ``Buffer``;
* ``reduction``: the ops (sum ... premul_sum) and their host kernels;
* ``memops``: scratch, copy and reduce per memory type, which the algorithms call.
"""
