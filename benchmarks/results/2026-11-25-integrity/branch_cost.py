"""The Python cost the integrity keyword adds to allreduce's fast branch, in isolation:
the same function with and without the extra keyword and condition (timeit, best of 7)."""
import timeit


class C:
    _fast = object()
    _integrity_every = 0


def before(self, tensor, op="sum", *, algo=None, timeout=None, async_op=False,
           deterministic=None, accumulate=None):
    fast = self._fast
    if fast is not None and algo is None and deterministic is None and accumulate is None:
        return 1
    return 0


def after(self, tensor, op="sum", *, algo=None, timeout=None, async_op=False,
          deterministic=None, accumulate=None, integrity=None):
    fast = self._fast
    if (fast is not None and algo is None and deterministic is None and accumulate is None
            and integrity is None and (not self._integrity_every
                                       or (self._exec.seq + 1) % self._integrity_every)):
        return 1
    return 0


c = C()
for name, fn in (("before", before), ("after", after)) * 2:
    t = min(timeit.repeat(lambda: fn(c, None), number=1_000_000, repeat=25))
    print(f"{name}: {t * 1e3:.1f} ns per call")


def keyword_only(self, tensor, op="sum", *, algo=None, timeout=None, async_op=False,
                 deterministic=None, accumulate=None, integrity=None):
    fast = self._fast
    if (fast is not None and algo is None and deterministic is None and accumulate is None
            and integrity is None):
        return 1
    return 0


for name, fn in (("before", before), ("keyword_only", keyword_only)) * 2:
    t = min(timeit.repeat(lambda: fn(c, None), number=1_000_000, repeat=25))
    print(f"{name}: {t * 1e3:.1f} ns per call")
