"""The compiled kernels of the fast path (numba, GIL released): publish, wait, reduce.

One shared segment per communicator (``segment.py`` has the layout): every rank owns two
slots (alternating between consecutive stages) of one header line followed by the payload.
The header line holds the ready flag, the call's sequence word, its signature and its length,
and the first 32 payload bytes: a message of up to 32 bytes travels in the same cache line as
its flag (NCCL's LL idea), so a reader that sees the flag has the data.

Calls are cut into *stages*, numbered by the communicator (every rank counts alike); a stage
uses slot ``stage & 1`` and raises the flag to ``2 * stage`` (inputs staged) and, for chunked
calls, to ``2 * stage + 1`` (this rank's share reduced). Reusing a slot two stages later needs
no acknowledgement: a peer publishes stage s+1 only after it finished stage s, and this rank
starts stage s+2 only after seeing every peer's stage s+1. The one exception is the one-way
broadcast (``broadcast_one_way``), whose ranks do not wait for every peer: the stage after it
waits for them first (``settle``), which restores the rule.

* ``allreduce`` (a message that fits one slot): copy my input into my slot, publish, wait for
  every peer's flag, reduce all slots in rank order (every rank computes bit-identical
  results, and one pass over the slots is all the traffic there is);
* ``allreduce_chunked`` (larger messages, Open MPI's shared-memory idea kept in cache): per
  chunk of one slot, stage what the others need (all but my 1/n share), publish; reduce my
  share in my own buffer from every other slot and copy the result into my slot, publish
  again; copy every other rank's reduced share into my buffer. The working set is n slots,
  which stay in cache; each rank reduces only its share, and no byte is copied twice.
  ``ordered`` (``deterministic=True``): I fold my share in rank order, in my slot, at the
  same cost (``allreduce_cma`` has the same switch).

Waiting polls (first with the CPU's relax hint, then with ``sched_yield`` between polls), then
sleeps on the segment's futex word; a publisher wakes sleepers only when
the sleeper count says there are some, so an uncontended call makes no system call at all.
A wait returns to Python after ``slice_ns`` of sleep without progress, so that deadlines,
dead peers and abort records are checked there.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from . import segment as layout
from .atomics import (
    FUTEX_WAIT,
    FUTEX_WAKE,
    SYS_FUTEX,
    SYS_PROCESS_VM_READV,
    SYS_PROCESS_VM_WRITEV,
    address_of,
    bytes_at,
    copy_bytes,
    cpu_relax,
    fetch_add,
    full_fence,
    load_acquire,
    sched_yield,
    store_release,
    syscall6,
    syscall7,
    view_as,
)
from .combine import OP_NONE, combine, combine_into, combine_left

# the segment's layout (segment.py), and its slot arithmetic compiled
HEADER_BYTES, FUTEX_WORD, SLEEPERS = layout.HEADER_BYTES, layout.FUTEX_WORD, layout.SLEEPERS
PID_BASE, TIMESPEC_BASE = layout.PID_BASE, layout.TIMESPEC_BASE
FLAG, SEQ, SIG, NBYTES, DATA = layout.FLAG, layout.SEQ, layout.SIG, layout.NBYTES, layout.DATA
slot_offset = njit(nogil=True, cache=True)(layout.slot_offset)

# status codes
DONE = 0
SLEPT = 1                    # a sleep slice passed without progress: check peers, call again
CMA_REFUSED = 2              # a rank could not read the root's memory: nobody used it
CMA_BROKEN = 3               # a read of a peer's memory failed after the buffers changed
#: ``allreduce_chunked`` reports a sleep as SLEPT_AT + the position to resume from
SLEPT_AT = 1 << 40
# a negative status -(r + 1): rank r published this call with another sequence number or
# signature (the ranks disagree about the call)



@njit(nogil=True, cache=True)
def _raise_flag(seg, words, w, value):
    """Release-store ``value`` into the flag at word ``w`` and wake any sleeper.

    Every publisher wakes the sleepers (when the count says there are some), not only the
    last one: with more ranks than cores, waking them as the flags arrive lets the scheduler
    run them in turn; waking all at the end made a crowded call about twice as slow."""
    store_release(words, w + FLAG, value)
    full_fence()                      # the flag before the sleeper count (see _wait)
    ints = view_as(seg, np.uint32)
    if load_acquire(ints, SLEEPERS) != 0:
        fetch_add(ints, FUTEX_WORD, 1)
        syscall6(SYS_FUTEX, address_of(ints, FUTEX_WORD), FUTEX_WAKE, 0x7FFFFFFF, 0, 0)


@njit(nogil=True, cache=True)
def _stage(seg, words, src, start, nbytes, keep_lo, keep_hi, rank, stride, stage, seq, sig,
           total):
    """Copy ``nbytes`` of ``src`` from byte ``start`` into my slot, except the bytes
    ``[keep_lo, keep_hi)`` of that range (my own share: nobody else reads it), and publish."""
    base = slot_offset(rank, stage & 1, stride)
    copy_bytes(seg, base + DATA, src, start, keep_lo)
    copy_bytes(seg, base + DATA + keep_hi, src, start + keep_hi, nbytes - keep_hi)
    w = base // 8
    words[w + SEQ] = seq
    words[w + SIG] = sig
    words[w + NBYTES] = total
    _raise_flag(seg, words, w, 2 * stage)


@njit(nogil=True, cache=True)
def _missing(words, rank, n, stride, stage, flag, seq, sig, nbytes, only):
    """0 when every peer's flag of ``stage`` has reached ``flag``; 1 while some have not;
    -(r+1) when rank r staged this stage for a different call (checked when ``flag`` is even).
    ``only`` >= 0: that peer alone (a broadcast's receiver waits for its root, nobody else).

    "Reached", not "equals": a peer may already have reduced its share of the stage (flag
    ``2 * stage + 1``) while this rank still looks for the staged inputs; it cannot be further
    on (stage + 2 needs this rank's flags of stage + 1), so a higher flag is this stage's."""
    parity = stage & 1
    waiting = 0
    for r in range(n):
        if r == rank or (only >= 0 and r != only):
            continue
        w = slot_offset(r, parity, stride) // 8
        if np.int64(load_acquire(words, w + FLAG)) < flag:
            waiting = 1
            continue
        if flag & 1 == 0 and (words[w + SEQ] != seq or words[w + SIG] != sig
                              or words[w + NBYTES] != nbytes):
            return -(r + 1)
    return waiting


@njit(nogil=True, cache=True)
def _wait(seg, words, rank, n, stride, stage, flag, seq, sig, nbytes, spin, slice_ns):
    """Wait for every peer's ``flag`` of ``stage`` (``_wait_for``)."""
    return _wait_for(seg, words, rank, n, stride, stage, flag, seq, sig, nbytes, spin,
                     slice_ns, -1)


@njit(nogil=True, cache=True)
def _wait_for(seg, words, rank, n, stride, stage, flag, seq, sig, nbytes, spin, slice_ns,
              only):
    """Wait for every peer's ``flag`` of ``stage`` (``only`` >= 0: that peer's). ``spin``
    is the wait policy: its low 32 bits count polls with the CPU's relax hint, its high bits
    polls with ``sched_yield`` between them; then the futex (``slice_ns`` at most)."""
    relax = spin & 0xFFFFFFFF
    yields = spin >> 32
    while True:
        for i in range(relax + yields):
            state = _missing(words, rank, n, stride, stage, flag, seq, sig, nbytes, only)
            if state <= 0:
                return state
            if i < relax:
                cpu_relax()
            else:               # let a runnable peer have this core
                sched_yield()
        ints = view_as(seg, np.uint32)
        fetch_add(ints, SLEEPERS, 1)
        generation = load_acquire(ints, FUTEX_WORD)
        state = _missing(words, rank, n, stride, stage, flag, seq, sig, nbytes, only)
        if state <= 0:
            fetch_add(ints, SLEEPERS, -1)
            return state
        ts = TIMESPEC_BASE + 2 * rank
        words[ts] = slice_ns // 1000000000
        words[ts + 1] = slice_ns % 1000000000
        rc = syscall6(SYS_FUTEX, address_of(ints, FUTEX_WORD), FUTEX_WAIT, generation,
                      address_of(words, ts), 0)
        fetch_add(ints, SLEEPERS, -1)
        if rc != 0 and load_acquire(ints, FUTEX_WORD) == generation:
            state = _missing(words, rank, n, stride, stage, flag, seq, sig, nbytes, only)
            return SLEPT if state > 0 else state     # timed out (or interrupted)


@njit(nogil=True, cache=True)
def _fold_share(seg, dst, lo, hi, rank, n, parity, stride, offset, op):
    """``dst[lo:hi]`` (rank's share, at byte ``offset`` of every slot) = the rank-order fold
    of every rank's copy, rank's own taken from ``dst``; the result is in rank's slot too,
    where the others gather it. The fold accumulates in rank's slot, which does not hold
    rank's share (``_stage`` leaves it out), so that ``dst`` keeps rank's input until its
    turn: no byte more is copied than by the own-first fold. For rank > 0 (rank 0's own-first
    fold is the rank order already)."""
    item = dst.itemsize
    nbytes = (hi - lo) * item
    own = dst[lo:hi]
    out = slot_offset(rank, parity, stride) + DATA + offset
    acc = view_as(seg[out:out + nbytes], dst.dtype)
    first = slot_offset(0, parity, stride) + DATA + offset
    second = slot_offset(1, parity, stride) + DATA + offset
    combine_into(acc, view_as(seg[first:first + nbytes], dst.dtype),
                  own if rank == 1 else view_as(seg[second:second + nbytes], dst.dtype), op)
    for r in range(2, n):
        start = slot_offset(r, parity, stride) + DATA + offset
        combine(acc, own if r == rank else view_as(seg[start:start + nbytes], dst.dtype), op)
    copy_bytes(view_as(own, np.uint8), 0, seg, out, nbytes)


@njit(nogil=True, cache=True)
def _reduce_slots(seg, dst, lo, hi, n, parity, stride, offset, op):
    """``dst[lo:hi]`` = the slots' elements at byte ``offset`` on, reduced in rank order."""
    item = dst.itemsize
    nbytes = (hi - lo) * item
    out = dst[lo:hi]
    copy_bytes(view_as(out, np.uint8), 0, seg, slot_offset(0, parity, stride) + DATA + offset,
               nbytes)
    for r in range(1, n):
        start = slot_offset(r, parity, stride) + DATA + offset
        combine(out, view_as(seg[start:start + nbytes], dst.dtype), op)


@njit(nogil=True, cache=True)
def allreduce(seg, dst, rank, n, stride, stage, seq, sig, op, resume, spin, slice_ns):
    """Allreduce ``dst`` (at most one slot) in place in one stage (op: see
    ``combine.OP_*``; OP_NONE only exchanges). Returns DONE, SLEPT (call again with
    ``resume``) or -(r+1) for a disagreeing rank r."""
    words = view_as(seg, np.uint64)
    raw = view_as(dst, np.uint8)
    if not resume:
        _stage(seg, words, raw, 0, raw.size, raw.size, raw.size, rank, stride, stage, seq, sig,
               raw.size)
    state = _wait(seg, words, rank, n, stride, stage, 2 * stage, seq, sig, raw.size, spin,
                  slice_ns)
    if state != DONE or op == OP_NONE:
        return state
    _reduce_slots(seg, dst, 0, dst.size, n, stage & 1, stride, 0, op)
    return DONE


#: int64 words of a bound call's constants (``allreduce_bound``, ``broadcast_bound``,
#: ``settle_bound``)
BOUND_WORDS = 10


@njit(nogil=True, cache=True)
def allreduce_bound(dst, constants, stage, seq):
    """``allreduce`` as a bound fast call runs it (``FastPath.bind``): what never changes for
    the call is ten int64 words at the address ``constants`` (the segment's address and
    length, rank, ranks, stride, signature, op (a broadcast's root), wait policy, sleep
    slice, and the address of the runner's ``pending`` words), so that the entry point
    unboxes one array and three integers instead of twelve arguments. The caller keeps the
    words' array alive and holds the segment's array while the call runs, so that the
    mapping stays (``FastPath.bind``)."""
    call = view_as(bytes_at(constants, BOUND_WORDS * 8), np.int64)
    seg = bytes_at(call[0], call[1])
    return allreduce(seg, dst, call[2], call[3], call[4], stage, seq, call[5], call[6], False,
                     call[7], call[8])


@njit(nogil=True, cache=True)
def _share(count, n, r):
    """Element range [lo, hi) of rank r's share of ``count`` elements."""
    base = count // n
    extra = count % n
    lo = r * base + min(r, extra)
    return lo, lo + base + (1 if r < extra else 0)


@njit(nogil=True, cache=True)
def allreduce_chunked(seg, dst, rank, n, stride, capacity, stage0, seq, sig, op, ordered,
                      resume, position, spin, slice_ns):
    """Allreduce ``dst`` in place through the slots, one chunk of ``capacity`` bytes per
    stage (stages ``stage0`` on). After a SLEPT_AT + position status, call again with
    ``resume`` and that position: 2 * chunk + (0: inputs wait, 1: reduced-shares wait).

    A rank folds its share starting from its own buffer, ``(x_rank op x_0) op x_1 ...``.
    ``ordered`` (``deterministic=True``) folds it in rank order instead, ``((x_0 op x_1) op
    x_2) ...`` (buffers/folding.py), at the same cost: rank 0's own-first fold is that
    already, the others fold in their slot (``_fold_share``)."""
    words = view_as(seg, np.uint64)
    raw = view_as(dst, np.uint8)
    item = dst.itemsize
    per_chunk = capacity // item
    count = dst.size
    total = raw.size
    chunks = (count + per_chunk - 1) // per_chunk
    chunk = position // 2
    phase = position % 2
    while chunk < chunks:
        stage = stage0 + chunk
        parity = stage & 1
        lo = chunk * per_chunk
        hi = min(count, lo + per_chunk)
        a, b = _share(hi - lo, n, rank)          # my share of the chunk (elements)
        mine = slot_offset(rank, parity, stride) + DATA
        if phase == 0:
            if not resume:   # stage what the others need: all but my share
                _stage(seg, words, raw, lo * item, (hi - lo) * item, a * item, b * item, rank,
                       stride, stage, seq, sig, total)
            resume = False
            state = _wait(seg, words, rank, n, stride, stage, 2 * stage, seq, sig, total,
                          spin, slice_ns)
            if state != DONE:
                return SLEPT_AT + 2 * chunk if state == SLEPT else state
            # reduce my share (only this rank reduces it: every rank gets the same bits) in
            # my buffer, and put the result where the others gather it
            if ordered and rank > 0:
                _fold_share(seg, dst, lo + a, lo + b, rank, n, parity, stride, a * item, op)
            else:
                share = dst[lo + a:lo + b]
                for r in range(n):
                    if r != rank:
                        start = slot_offset(r, parity, stride) + DATA + a * item
                        combine(share, view_as(seg[start:start + (b - a) * item], dst.dtype),
                                 op)
                copy_bytes(seg, mine + a * item, raw, (lo + a) * item, (b - a) * item)
            _raise_flag(seg, words, slot_offset(rank, parity, stride) // 8, 2 * stage + 1)
            phase = 1
        resume = False
        state = _wait(seg, words, rank, n, stride, stage, 2 * stage + 1, seq, sig, total,
                      spin, slice_ns)
        if state != DONE:
            return SLEPT_AT + 2 * chunk + 1 if state == SLEPT else state
        for r in range(n):           # every other rank's reduced share into my buffer
            if r != rank:
                a, b = _share(hi - lo, n, r)
                copy_bytes(raw, (lo + a) * item, seg,
                           slot_offset(r, parity, stride) + DATA + a * item, (b - a) * item)
        chunk += 1
        phase = 0
    return DONE


@njit(nogil=True, cache=True)
def broadcast(seg, dst, rank, n, stride, capacity, stage0, seq, sig, root, resume, position,
              spin, slice_ns):
    """Broadcast ``dst`` from ``root``, one chunk of ``capacity`` bytes per stage: the root
    stages the chunk, every other rank publishes an empty stage (it is ready: done with the
    chunk before), all wait for all, the others copy the chunk out. The root stages chunk
    c + 1 while the others still copy chunk c. After SLEPT_AT + c, call again with
    ``resume`` and position c."""
    words = view_as(seg, np.uint64)
    raw = view_as(dst, np.uint8)
    total = raw.size
    chunks = max(1, (total + capacity - 1) // capacity)
    chunk = position
    while chunk < chunks:
        stage = stage0 + chunk
        lo = chunk * capacity
        nbytes = min(total, lo + capacity) - lo
        if not resume:
            keep = nbytes if rank == root else 0     # the others stage nothing
            _stage(seg, words, raw, lo, nbytes, keep, nbytes, rank, stride, stage, seq, sig,
                   total)
        resume = False
        state = _wait(seg, words, rank, n, stride, stage, 2 * stage, seq, sig, total, spin,
                      slice_ns)
        if state != DONE:
            return SLEPT_AT + chunk if state == SLEPT else state
        if rank != root:
            copy_bytes(raw, lo, seg, slot_offset(root, stage & 1, stride) + DATA, nbytes)
        chunk += 1
    return DONE


@njit(nogil=True, cache=True)
def settle(seg, rank, n, stride, pending, spin, slice_ns):
    """Wait until every peer has published the stage of the one-way broadcast in
    ``pending`` (stage, sequence word, signature, bytes; stage -1: nothing pending), which
    means it is done with the stage before: the slots of this rank's next stage are free
    again. Every stage's first write calls it first (``broadcast_one_way`` itself, the
    runner before any other kernel). DONE (pending cleared), SLEPT, or -(r+1) for a rank
    that published another call in that stage."""
    if pending[0] < 0:
        return DONE
    words = view_as(seg, np.uint64)
    state = _wait(seg, words, rank, n, stride, pending[0], 2 * pending[0], pending[1],
                  pending[2], pending[3], spin, slice_ns)
    if state == DONE:
        pending[0] = -1
    return state


@njit(nogil=True, cache=True)
def broadcast_one_way(seg, dst, rank, n, stride, stage, seq, sig, root, position, spin,
                      slice_ns, pending):
    """Broadcast ``dst`` (one slot at most) from ``root`` in one stage, one way: the root
    stages it and returns; every other rank publishes an empty stage, waits for the root's
    flag alone, and copies. Nobody waits for the receivers here: the stage stays in
    ``pending`` and the next stage settles it (``settle``) before it writes a slot, which
    is what protects the root's slot from being overwritten while a receiver still reads
    it. Position 0: settle the previous one-way stage, then stage; 1: wait for the root.
    After SLEPT_AT + p, call again with position p."""
    words = view_as(seg, np.uint64)
    raw = view_as(dst, np.uint8)
    total = raw.size
    if position == 0:
        state = settle(seg, rank, n, stride, pending, spin, slice_ns)
        if state != DONE:
            return SLEPT_AT if state == SLEPT else state
        keep = total if rank == root else 0
        _stage(seg, words, raw, 0, total, keep, total, rank, stride, stage, seq, sig, total)
        pending[0] = stage
        pending[1] = seq
        pending[2] = sig
        pending[3] = total
        if rank == root:
            return DONE
    state = _wait_for(seg, words, rank, n, stride, stage, 2 * stage, seq, sig, total, spin,
                      slice_ns, root)
    if state != DONE:
        return SLEPT_AT + 1 if state == SLEPT else state
    copy_bytes(raw, 0, seg, slot_offset(root, stage & 1, stride) + DATA, total)
    return DONE


@njit(nogil=True, cache=True)
def broadcast_bound(dst, constants, stage, seq):
    """``broadcast_one_way`` as a bound fast call runs it, from position 0 (the constants of
    ``allreduce_bound``, the root where the op is)."""
    call = view_as(bytes_at(constants, BOUND_WORDS * 8), np.int64)
    seg = bytes_at(call[0], call[1])
    pending = view_as(bytes_at(call[9], 32), np.int64)
    return broadcast_one_way(seg, dst, call[2], call[3], call[4], stage, seq, call[5], call[6],
                             0, call[7], call[8], pending)


@njit(nogil=True, cache=True)
def settle_bound(dst, constants, stage, seq):
    """``settle`` as a bound fast call runs it before its own kernel (the constants of
    ``allreduce_bound``; ``dst``, ``stage`` and ``seq`` are not used): a barrier or an
    allreduce right after a one-way broadcast settles it without Python."""
    call = view_as(bytes_at(constants, BOUND_WORDS * 8), np.int64)
    seg = bytes_at(call[0], call[1])
    pending = view_as(bytes_at(call[9], 32), np.int64)
    return settle(seg, call[2], call[3], call[4], pending, call[7], call[8])


@njit(nogil=True, cache=True)
def _word(rank, stage, stride):
    """Index (uint64) of the first payload word of ``rank``'s slot of ``stage``: where the
    cross-memory kernels publish a buffer address or an outcome."""
    return slot_offset(rank, stage & 1, stride) // 8 + DATA // 8


@njit(nogil=True, cache=True)
def _all_done(words, n, stage, stride):
    """Whether every rank published outcome 1 (done) in ``stage``."""
    for r in range(n):
        if words[_word(r, stage, stride)] != 1:
            return False
    return True


@njit(nogil=True, cache=True)
def _cross_copy(local, pid, address, iov, write):
    """Copy ``local.size`` bytes between ``local`` and ``address`` in process ``pid``:
    from there (process_vm_readv) or, with ``write``, to there (process_vm_writev).
    ``iov``: 4 scratch words for the two iovecs. 0, or -1 if the kernel refused (no
    permission, the process is gone)."""
    total = local.size
    call = SYS_PROCESS_VM_WRITEV if write else SYS_PROCESS_VM_READV
    done = 0
    while done < total:
        iov[0] = address_of(local, done)
        iov[1] = total - done
        iov[2] = address + done
        iov[3] = total - done
        got = syscall7(call, pid, address_of(iov, 0), 1, address_of(iov, 2), 1, 0)
        if got <= 0:
            return -1
        done += got
    return 0


@njit(nogil=True, cache=True)
def broadcast_cma(seg, dst, rank, n, stride, stage0, seq, sig, root, resume, position, spin,
                  slice_ns, iov):
    """Broadcast ``dst`` from ``root`` with a single copy per rank (MPI's cross-memory
    attach), the copying shared by every rank: each rank publishes its buffer's address;
    each other rank reads all but the first 1/n of the root's buffer straight out of the
    root's memory, while the root writes that first 1/n into every other rank's buffer (it
    would idle otherwise: with two ranks, two cores copy half each). Then every rank
    publishes that it is done, with its outcome in the payload's first word, and the root
    keeps its buffer untouched until all are. Two stages; after SLEPT_AT + p, call again
    with ``resume`` and position p. Returns CMA_REFUSED, on every rank alike, when some rank
    could not read or write: the call is then to be run again another way. ``iov``: 4
    scratch words (the iovecs).

    One stage for the whole buffer: cutting it into stages of 1 or 4 MiB, so that the
    readers take the root's bytes from the cache together, made crowded ranks no faster and
    2 ranks slower."""
    words = view_as(seg, np.uint64)
    raw = view_as(dst, np.uint8)
    total = raw.size
    if position == 0:
        if not resume:
            words[_word(rank, stage0, stride)] = address_of(raw, 0)
            _stage(seg, words, raw, 0, 0, 0, 0, rank, stride, stage0, seq, sig, total)
        state = _wait(seg, words, rank, n, stride, stage0, 2 * stage0, seq, sig, total, spin,
                      slice_ns)
        if state != DONE:
            return SLEPT_AT if state == SLEPT else state
        head = total // n // 4096 * 4096      # the root's part: whole pages
        outcome = 1               # 1: done; 0: refused (a flag is never published as 0)
        if rank == root:
            for r in range(n):
                if r != root and head:
                    there = words[_word(r, stage0, stride)]
                    if _cross_copy(raw[:head], words[PID_BASE + r], there, iov, True) < 0:
                        outcome = 0
        else:
            there = words[_word(root, stage0, stride)]
            if _cross_copy(raw[head:], words[PID_BASE + root], there + head, iov, False) < 0:
                outcome = 0
        words[_word(rank, stage0 + 1, stride)] = outcome
        _stage(seg, words, raw, 0, 0, 0, 0, rank, stride, stage0 + 1, seq, sig, total)
    state = _wait(seg, words, rank, n, stride, stage0 + 1, 2 * (stage0 + 1), seq, sig, total,
                  spin, slice_ns)
    if state != DONE:
        return SLEPT_AT + 1 if state == SLEPT else state
    return DONE if _all_done(words, n, stage0 + 1, stride) else CMA_REFUSED


@njit(nogil=True, cache=True)
def allreduce_cma(seg, dst, rank, n, stride, stage0, seq, sig, op, ordered, resume, position,
                  spin, slice_ns, iov, tmp):
    """Allreduce ``dst`` in place reading the peers' buffers directly (cross-memory attach),
    as MPI's shared-memory reduce-scatter + allgather do. Four stages:

    0. every rank publishes its buffer's address; each reads one word of every peer's
       buffer to learn whether the OS lets it (nothing is modified yet, so a refusal can
       still be handed to another path with the inputs intact);
    1. every rank publishes that outcome; if any is 0, CMA_REFUSED on every rank alike.
       Else each rank reduces its 1/n share in its own buffer, reading every peer's copy of
       that share into ``tmp`` one cache-sized piece at a time (rank order: the bits do not
       depend on who is fast). It folds its own data first, ``(x_rank op x_0) op x_1 ...``;
       ``ordered`` (``deterministic=True``) folds in rank order, ``((x_0 op x_1) op x_2)
       ...`` (buffers/folding.py), at the same cost: per piece, rank r > 0 folds x_0 ..
       x_(r-1) in the second half of ``tmp``, combines its own piece on their right, in
       place, and the later ranks' as before;
    2. every rank publishes "reduced"; each reads every peer's reduced share straight into
       its own buffer;
    3. every rank publishes "done" (nobody reads my buffer any more).

    After SLEPT_AT + p, call again with ``resume`` and position p. CMA_BROKEN: a read
    failed once the buffers had changed (a peer gone, most likely): the call has failed.
    ``iov``: 4 + n scratch words (the iovecs, then every rank's buffer address); ``tmp``:
    two pieces of scratch bytes (a peer's piece, and an ordered fold's first ranks')."""
    words = view_as(seg, np.uint64)
    raw = view_as(dst, np.uint8)
    item = dst.itemsize
    count = dst.size
    total = raw.size
    piece = tmp.size // 2 // item
    while position < 4:
        stage = stage0 + position
        if not resume:
            mine = _word(rank, stage, stride)
            if position == 0:
                words[mine] = address_of(raw, 0)
            elif position == 1:
                outcome = 1
                for r in range(n):
                    there = words[_word(r, stage0, stride)]
                    iov[4 + r] = there          # kept: that slot is reused two stages on
                    if r != rank and _cross_copy(tmp[:8], words[PID_BASE + r], there, iov,
                                                 False) < 0:
                        outcome = 0
                words[mine] = outcome
            elif position == 2:
                lo, hi = _share(count, n, rank)
                for start in range(lo, hi, piece):
                    end = min(hi, start + piece)
                    nbytes = (end - start) * item
                    part = tmp[:nbytes]
                    acc = dst[start:end]
                    after = 0               # the ranks combined into ``acc`` from here on
                    if ordered and rank > 0:    # the ranks before mine, then mine
                        left = tmp[piece * item:piece * item + nbytes]
                        for r in range(rank):
                            into = left if r == 0 else part
                            if _cross_copy(into, words[PID_BASE + r],
                                           iov[4 + r] + start * item, iov, False) < 0:
                                return CMA_BROKEN
                            if r > 0:
                                combine(view_as(left, dst.dtype), view_as(part, dst.dtype), op)
                        combine_left(acc, view_as(left, dst.dtype), op)
                        after = rank + 1
                    for r in range(after, n):
                        if r == rank:
                            continue
                        if _cross_copy(part, words[PID_BASE + r], iov[4 + r] + start * item,
                                       iov, False) < 0:
                            return CMA_BROKEN
                        combine(acc, view_as(part, dst.dtype), op)
            elif position == 3:
                for r in range(n):
                    if r != rank:
                        lo, hi = _share(count, n, r)
                        if _cross_copy(raw[lo * item:hi * item], words[PID_BASE + r],
                                       iov[4 + r] + lo * item, iov, False) < 0:
                            return CMA_BROKEN
            _stage(seg, words, raw, 0, 0, 0, 0, rank, stride, stage, seq, sig, total)
        resume = False
        state = _wait(seg, words, rank, n, stride, stage, 2 * stage, seq, sig, total, spin,
                      slice_ns)
        if state != DONE:
            return SLEPT_AT + position if state == SLEPT else state
        if position == 1 and not _all_done(words, n, stage, stride):
            return CMA_REFUSED
        position += 1
    return DONE


#: the bound kernels' C entry points made so far: (name, dtype name) -> numba cfunc
_CFUNCS: dict = {}


def _entry_of(name, elem):
    """The Python function ``bound_cfunc`` compiles. Its closure holds the element type
    alone, and the kernel is a global: numba keys its on-disk cache on the pickled closure,
    and a dispatcher pickles differently in every process, so a kernel in the closure would
    compile anew (and add an entry to the cache's index) in every process that binds a call."""
    if name == "allreduce_bound":
        def entry(data, nbytes, constants, stage, seq):
            return allreduce_bound(view_as(bytes_at(data, nbytes), elem), constants, stage,
                                   seq)
    elif name == "broadcast_bound":
        def entry(data, nbytes, constants, stage, seq):
            return broadcast_bound(view_as(bytes_at(data, nbytes), elem), constants, stage,
                                   seq)
    elif name == "settle_bound":
        def entry(data, nbytes, constants, stage, seq):
            return settle_bound(view_as(bytes_at(data, nbytes), elem), constants, stage, seq)
    else:
        raise ValueError(f"no bound kernel {name!r}")
    return entry


def bound_cfunc(name, dtype):
    """A C entry point of the bound kernel ``name`` (``allreduce_bound``, ``broadcast_bound``
    or ``settle_bound``) for arrays of ``dtype``: ``int64 f(data address, bytes, constants
    address, stage, sequence word)``, for ``callpath.BoundCall`` to call with no Python in
    between. The caller keeps the returned cfunc alive for as long as it calls its
    ``address``. Compiled once per dtype and kept in numba's cache (``_entry_of``)."""
    key = (name, np.dtype(dtype).name)
    found = _CFUNCS.get(key)
    if found is None:
        from numba import cfunc, types

        signature = types.int64(types.int64, types.int64, types.int64, types.int64,
                                types.int64)
        entry = _entry_of(name, np.dtype(dtype).type)
        found = _CFUNCS[key] = cfunc(signature, nogil=True, cache=True)(entry)
    return found
