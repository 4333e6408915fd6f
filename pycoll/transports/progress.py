"""One progress engine per communicator tree: every transport progresses while anyone waits.

A waiter progresses *every* transport that has work, not only the channels of the requests
it waits for, so a send queued on any channel moves while any wait runs (a ring cannot
deadlock on a neighbour's unsent chunk, and a rendezvous handshake or a connection attempt
is answered while the caller waits for something else). Waiting escalates:

1. hot spin: progress without reading the clock (a shared-memory message arrives in about a
   microsecond);
2. spin until ``WaitPolicy.spin_seconds`` of idleness;
3. block: when every transport with work exposes file descriptors (sockets, an eventfd), in
   ``epoll`` with the GIL released, woken by the first readable or writable one; otherwise
   ``sched_yield`` for up to 2 ms, and then, when the only transport with work offers a
   doorbell (``Transport.doorbell``: shm's futex word, rung by every peer that publishes or
   frees a slot for this rank), asleep on it (announce, one more pass, then sleep unless
   that pass moved something), else timer sleeps growing to 1 ms. A yield that took longer
   than ``SLOW_YIELD_SECONDS`` gave the core away for a time slice: the next few idle spells
   with a doorbell go from the spin straight to it.

Why a doorbell for shared memory: under CPU oversubscription (ranks sharing cores with other
busy processes) a ``sched_yield`` gives the core away for the rest of another task's time
slice and a timer sleep lasts its whole length, so a message streamed through small slots,
one hand-off per slot, took a time slice per hand-off (docs/performance.md). A task woken from
a futex runs at once where the scheduler allows, and a wait that nobody rings still ends at
its deadline and at every liveness check below. Yields stay first while they are cheap: a
reply that comes within the 2 ms (a small call's, the peer running on another core) is
found sooner than a futex sleep and its wake-up would.

Every 50 ms of idleness (longer when ranks crowd the cores: each idle rank wakes that often)
the engine asks the transports whether a peer is gone and calls the communicator's ``check``
(abort records of other ranks). No ``select.select`` anywhere: it
fails for descriptors above 1024.

The engine's lock serialises posting and progress between threads once the channels are
shared by several communicators (a world and its groups may run on different threads);
before that, a communicator's calls never overlap (its executor runs one at a time) and the
lock is skipped: a small allreduce takes a few lock operations' worth of microseconds.
Transports keep no locks of their own.
"""
from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..envvars import env_float
from ..errors import TransportError
from .base import Doorbell, Request, Transport


class WaitTimeout(TransportError):
    """A wait reached its deadline; ``pending`` lists the requests still open, ``peers`` the
    ranks waited for (from the requests, or given: the fast path waits on flags, not
    requests)."""

    def __init__(self, pending: Sequence[Request], peers: Sequence[int] | None = None) -> None:
        self.pending = list(pending)
        self.peers = (sorted({r.channel.peer for r in self.pending}) if peers is None
                      else sorted(peers))
        super().__init__(f"deadline passed waiting for peer rank(s) {self.peers}")


# How long a waiter yields before it escalates to short sleeps, and the longest sleep.
YIELD_SECONDS = 2e-3
MAX_SLEEP_SECONDS = 1e-3
LIVENESS_INTERVAL = 0.05
#: a ``sched_yield`` that took longer handed the core to another task for a time slice:
#: the next this many idle spells go from the spin straight to the doorbell (where there is
#: one). A yield that returns sooner costs less than a futex sleep and its wake-up, and the
#: spin stays: a small call's reply mostly comes within it, and a woken task may wait for
#: its core longer than the spin lasts. Many spells: each yield that probes whether the
#: core is still contended costs a time slice when it is, so probing often gives back what
#: skipping the yields won (docs/performance.md, "Waiting on shared memory when ranks share
#: cores")
SLOW_YIELD_SECONDS = 200e-6
SLOW_YIELD_SKIPS = 256


class WaitPolicy:
    """How eagerly a waiter spins before yielding; process-wide, set from the rank layout.

    With a core per rank, spinning (``hot_spins`` polls without reading the clock, then up to
    ``spin_seconds``) wins. With more ranks on this host than cores, the peer we wait for may
    not even be running: every microsecond of spinning is stolen from it, so an
    oversubscribed waiter yields at once. ``PYCOLL_SPIN_US`` overrides the spin time.
    """

    spin_seconds = 50e-6
    hot_spins = 64
    crowded = False       # more ranks on this machine than cores: CPU time is the bottleneck
    #: how often an idle waiter checks peers and abort records: every idle rank wakes this
    #: often, so with many ranks per core it grows (to 1 s at 20 ranks per core)
    liveness_seconds = LIVENESS_INTERVAL
    #: the most ranks per machine any communicator of this process saw (a test harness
    #: resets it: a forked rank, or threads as ranks, start from their own layout)
    most_ranks = 0

    @classmethod
    def configure(cls, ranks_on_host: int) -> None:
        """Called by every communicator's setup; a sub-group never relaxes the policy a
        larger communicator of the same process needed."""
        cls.most_ranks = max(cls.most_ranks, ranks_on_host)
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        oversubscribed = cls.crowded = cls.most_ranks > cores
        spin_us = env_float("PYCOLL_SPIN_US", 0.0 if oversubscribed else 50.0, minimum=0.0)
        cls.spin_seconds = spin_us * 1e-6
        cls.hot_spins = 64 if cls.spin_seconds > 0 else 1
        per_core = cls.most_ranks / cores
        cls.liveness_seconds = min(1.0, LIVENESS_INTERVAL * max(1.0, per_core))


def raise_errors(requests: Sequence[Request]) -> None:
    for r in requests:
        if r.error is not None:
            raise r.error


class ProgressEngine:
    """Drives every transport of a communicator tree until the requests of a wait are done."""

    def __init__(self) -> None:
        self.transports: list[Transport] = []
        self.lock = threading.Lock()
        #: several communicators share these channels: posting and progress take ``lock``
        self.shared = False
        self._epoll: select.epoll | None = None
        self._registered: dict[int, int] = {}
        self._block_lock = threading.Lock()
        #: idle spells left that go from the spin straight to the doorbell, because a
        #: recent yield gave the core to another task for a time slice
        self._slow_yields = 0

    def add(self, transport: Transport) -> None:
        self.transports.append(transport)

    def progress(self) -> bool:
        """One pass over every transport; True if anything moved."""
        moved = False
        with self.lock:
            for t in self.transports:
                if t.progress():
                    moved = True
        return moved

    def share(self, idle: AbstractContextManager[Any]) -> None:
        """From now on several communicators (threads) use these channels: take the lock.
        ``idle`` is entered while switching, so that no unlocked pass is still running."""
        if not self.shared:
            with idle:
                self.shared = True

    def wait(self, requests: Sequence[Request], deadline: float,
             check: Callable[[], None] | None = None) -> None:
        """Progress until every request is done.

        Raises the first request's error (``PeerLost``, ``MessageSizeMismatch``, ...),
        ``WaitTimeout`` at ``deadline`` (a ``time.monotonic()`` value), or whatever ``check``
        raises (the communicator uses it to notice aborts from other ranks).
        """
        for r in requests:          # fast path: often everything finished while being posted
            if not r.done:
                break
        else:
            raise_errors(requests)
            return
        transports = self.transports
        lock = self.lock
        spins = 0
        escalated = False     # this idle spell went past the spin
        idle_since = 0.0
        next_liveness = 0.0
        sleep = 20e-6
        while True:
            moved = self._pass()
            for r in requests:
                if not r.done:
                    break
            else:
                raise_errors(requests)
                return
            for r in requests:
                if r.error is not None:
                    raise r.error
            if moved:
                spins = 0
                idle_since = 0.0
                escalated = False
                sleep = 20e-6
                continue
            spins += 1
            if spins < WaitPolicy.hot_spins:
                continue       # hot spin: no clock reads
            now = time.monotonic()
            if idle_since == 0.0:
                idle_since = now
                if next_liveness == 0.0:
                    next_liveness = now + WaitPolicy.liveness_seconds
                if self._refuse_conflicts(requests):
                    continue      # a held message proved a receive wrong: it failed
            idle = now - idle_since
            if idle < WaitPolicy.spin_seconds:
                continue
            if not escalated:
                escalated = True
                if self._slow_yields:
                    self._slow_yields -= 1        # see SLOW_YIELD_SECONDS
            if now >= deadline:
                raise WaitTimeout([r for r in requests if not r.done])
            if now >= next_liveness:
                next_liveness = now + WaitPolicy.liveness_seconds
                with lock:
                    for t in transports:
                        if t.progress():      # idle transports too: peers dialing in
                            moved = True
                        t.check_alive()
                    for r in requests:        # and the channels this wait depends on,
                        if not r.done:        # active or not (a broken one raises)
                            r.channel.check_alive()
                            r.channel.refuse_conflicts()
                if check is not None:
                    check()
                if moved:
                    continue
            fds = bell = None
            busy = [t for t in transports if t.active.channels]
            if all(t.pollable for t in busy):
                fds = self._block_fds()
            elif len(busy) == 1 and not any(t.setup_pending for t in transports):
                # shared memory alone has work: its doorbell, if any. Not while a transport
                # sets up: its handshakes progress only in passes, which the sleep would stop
                bell = busy[0].doorbell()
            if fds is not None:
                self._block(fds, max(0.0, min(deadline - now, WaitPolicy.liveness_seconds)))
            elif idle < YIELD_SECONDS and not (bell is not None and self._slow_yields):
                os.sched_yield()
                if bell is not None and time.monotonic() - now > SLOW_YIELD_SECONDS:
                    self._slow_yields = SLOW_YIELD_SKIPS    # the core went to another task
            elif bell is not None:
                self._ring_wait(bell, min(deadline, next_liveness) - now)
            else:
                time.sleep(sleep)
                sleep = min(sleep * 2, MAX_SLEEP_SECONDS)

    def _pass(self) -> bool:
        """One pass of a wait: only the channels with work, unless a transport is setting
        up; True if anything moved."""
        moved = False
        shared = self.shared
        if shared:
            self.lock.acquire()
        try:
            for t in self.transports:
                if t.setup_pending:
                    if t.progress():
                        moved = True
                elif t.active.channels and t.active.progress():
                    moved = True
        finally:
            if shared:
                self.lock.release()
        return moved

    def _ring_wait(self, bell: Doorbell, timeout: float) -> None:
        """Sleep on ``bell`` (``timeout`` seconds at most) unless a pass after announcing
        the sleep moves something: whatever a peer publishes after that pass rings."""
        sequence = bell.announce()
        try:
            if not self._pass():
                bell.sleep(sequence, timeout)
        finally:
            bell.withdraw()

    def _refuse_conflicts(self, requests: Sequence[Request]) -> bool:
        """Idle: let the channels this wait depends on fail receives that a held message
        proves wrong (ranks disagreeing about a call; ``matching.py``). Off the hot path:
        a disagreement always leaves a receive waiting, so the first idle moment finds it."""
        found = False
        for r in requests:
            match = r.channel.matcher
            if match.unexpected and match.posted and not r.done:   # cheap: usually false
                with self.lock:
                    found = r.channel.refuse_conflicts() or found
        return found

    def _block_fds(self) -> list[tuple[int, int]]:
        """Descriptors of the pollable transports to block on."""
        fds: list[tuple[int, int]] = []
        with self.lock:
            for t in self.transports:
                if t.pollable:
                    fds.extend(t.wait_fds() or ())
        return fds

    def _block(self, fds: list[tuple[int, int]], timeout: float) -> None:
        with self._block_lock:   # threads sharing the engine share its epoll bookkeeping
            ep = self._sync_epoll(fds)
        if ep is not None:
            ep.poll(timeout)     # several threads may wait on one epoll at once
        else:
            time.sleep(min(timeout, MAX_SLEEP_SECONDS))

    def _sync_epoll(self, fds: list[tuple[int, int]]) -> select.epoll | None:
        """Register exactly ``fds`` with the engine's epoll; None when there are none."""
        ep = self._epoll
        if ep is None:
            ep = self._epoll = select.epoll()
        registered = self._registered
        wanted = dict(fds)
        for fd in [fd for fd in registered if fd not in wanted]:
            del registered[fd]
            try:
                ep.unregister(fd)
            except OSError:
                pass    # closed already (epoll forgot it)
        for fd, events in wanted.items():
            if registered.get(fd) == events:
                continue
            try:
                if fd in registered:
                    ep.modify(fd, events)
                else:
                    ep.register(fd, events)
            except FileExistsError:
                ep.modify(fd, events)
            except FileNotFoundError:
                ep.register(fd, events)    # a new descriptor reusing a closed one's number
            except OSError:
                continue
            registered[fd] = events
        return ep if wanted else None

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None
        self._registered.clear()
