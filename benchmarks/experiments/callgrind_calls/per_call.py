"""per_call.py PROFILE...: instructions per call around the kernel, from cg_loop.py's profiles:
(FastMethod's inclusive instructions - the numba code that bound_vectorcall calls - the
Python a kernel that slept hands its call to) / 6152 calls. The numba code's waits and the
sleeps depend on when the peer arrives; the rest is the same from run to run."""
import re
import subprocess
import sys


def num(line):
    return int(line.split()[0].replace(",", ""))


for out in sys.argv[1:]:
    text = subprocess.run(["callgrind_annotate", "--tree=calling", "--inclusive=yes",
                           "--threshold=100", out], capture_output=True, text=True).stdout
    blocks = text.split("\n\n")

    def block(name, blocks=blocks, out=out):
        for b in blocks:
            first = b.strip().split("\n")[0]
            if re.search(rf"\*\s+\S*_callpath\.c:{name} \[", first):
                return b.strip().split("\n")
        raise SystemExit(f"{out}: no {name}")
    m = num(block("method_vectorcall")[0])
    b = block("bound_vectorcall")
    # the numba code (kernel, settle: its waits depend on timing), and the Python that a
    # kernel that slept hands the rest of its call to (``after``: PyObject_Vectorcall)
    k = sum(num(ln) for ln in b[1:] if ">   ???:" in ln or "call.c:PyObject_Vectorcall" in ln)
    print(f"{out}: FastMethod inclusive {m:,} Ir, numba code {k:,} Ir, "
          f"around the kernel {(m - k) / 6152:,.0f} Ir per call (6152 calls)")
