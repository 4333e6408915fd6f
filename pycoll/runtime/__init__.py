"""The runtime: how one call of a communicator is numbered, recorded, run and reported.

* ``calls``: ``CallInfo``, the one description of a call that planning, tags, the flight
  recorder, DETAIL's fingerprints, profiler events and error messages share;
* ``execution``: sequence numbers, inline or queued runs in issue order, deadlines;
* ``work``: work handles and the executor thread;
* ``failures``: what happens when a call fails (the error the user sees, the abort record,
  DETAIL's cross-rank check);
* ``abort``: the job-wide abort record in the store;
* ``flight_recorder``: the last N calls, dumped on failure.
"""
