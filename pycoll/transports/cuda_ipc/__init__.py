"""CUDA IPC transport (same host): device memory moved GPU to GPU, no host copy.

* ``transport``: ``CudaIpcTransport``: shm's transport plus the device half, probe;
* ``channel``: ``CudaIpcChannel``: shm's channel plus the device message kind;
* ``ipc``: ``DeviceIpc``: exporting, opening and copying device memory through IPC handles.

It is the shared-memory transport (``shm/``: slots, rendezvous completion words, peer
liveness) with one more message kind, added by ``CudaIpcChannel`` through the shm channel's
hooks (shm itself knows nothing of devices). Host messages travel exactly as over shm.

A small device message (up to one slot's payload) is eager: the sender copies it into the
slot (device to host, on pycoll's stream, after the work queued there; the sender waits for
the copy), and the receiver copies it from the slot, or from the copy it held for a receive
not yet posted, into its device buffer. So small messages need no completion word and
outlive their sender, as host messages do: a rendezvous would keep the sender's completion
window (64 words) and its buffer until received, and enough unmatched ones stop the pair.

A larger device message is a rendezvous, and needs its sender alive until it is received
(as NCCL's peer-to-peer transfers do):

1. the sender records an interprocess event on pycoll's stream (after the kernels that
   produced the data) and puts into a slot the IPC handle of the allocation holding the
   data, the data's offset in it (pool allocators hand out pieces of larger allocations:
   torch's caching allocator and CuPy's pool both do, and the handle only names the base),
   and the event's handle;
2. the receiver opens the handle (once per allocation: mappings are cached), makes its
   stream wait for the sender's event (a GPU-side wait), and queues one device-to-device copy
   from the peer's memory into the receive buffer;
3. when the copy has run (an event polled by progress, while the receiver waits for its
   receive), the receiver sets the rendezvous completion word and the receive completes;
   the sender's request completes when it sees the word: its buffer is its own again.
   ``close`` finishes the copies still queued first.

Driver calls come after a runtime call made the device current on the calling thread
(``runtime.make_current``): async calls run on pycoll's own thread, which has no context.

The host-side sequence number in the completion word is what orders re-recorded events
(an event has no generation number of its own). Same device or different devices of one
host both work (``cudaIpcMemLazyEnablePeerAccess``; one GPU shared by several ranks is the
case NCCL also treats as peer-to-peer). Memory from ``cudaMallocManaged`` or VMM allocations
(torch's ``expandable_segments``) cannot be exported with legacy IPC handles; the sender then
raises a clear error (use the default allocator, or host memory).

A rank that passes device memory where its peer passes host memory (or the reverse) is
refused on both sides with an error, never a silent reinterpretation.
"""
