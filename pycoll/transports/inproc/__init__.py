"""In-process transport: ranks are threads of one process.

It exists so that algorithms, selection, lazy connections and the bootstrap can run at
hundreds or thousands of ranks in CI (``pycoll.testing.run_threads``), where a process per
rank would not fit. It is a real transport with the same shape as the others.

* ``transport``: ``InprocTransport``: probe, endpoints by key, mailboxes, the eventfd;
* ``channel``: ``InprocChannel``: eager copies, single copies from the sender, puts.
"""
