"""Install wheels into a new virtual environment with nothing but the standard library.

The GPU machine's Python may have no pip, and nothing can be downloaded there; the MPI
wheels for its CPU comparison (cpu.txt) travel in ``.whl/`` (docs/cuda.md). So this does the
few steps of pip's install that those wheels need:

    python3 tools/gpu/install_wheels.py PREFIX WHEEL...

PREFIX becomes a venv without pip. A ``.pth`` file in it reaches this interpreter's own
packages (numpy, numba, torch: what pycoll's and the MPI jobs import), after the venv's own,
so the wheels' mpi4py wins over any mpi4py installed there. Each wheel is unpacked as pip
would: its packages into site-packages, ``<name>.data/data`` into PREFIX (the MPI wheels'
``bin/mpiexec`` and ``lib/libmpi.so``, where mpi4py looks for them), ``.data/scripts`` into
PREFIX/bin with ``#!python`` pointed at the venv's interpreter, executable bits kept.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile


def unpack(wheel: str, prefix: str, site: str) -> int:
    """Unpack one wheel; returns the number of files written."""
    python = os.path.join(prefix, "bin", "python")
    where = {"data": prefix, "scripts": os.path.join(prefix, "bin"), "purelib": site,
             "platlib": site, "headers": os.path.join(prefix, "include")}
    count = 0
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.is_dir():
                continue
            parts = info.filename.split("/")
            if parts[0].endswith(".data"):
                dest, parts = where[parts[1]], parts[2:]
                script = info.filename.split("/")[1] == "scripts"
            else:
                dest, script = site, False
            path = os.path.join(dest, *parts)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with z.open(info) as src, open(path, "wb") as out:
                if script:
                    first = src.readline()
                    if first.startswith(b"#!python"):
                        first = b"#!" + python.encode() + first[len(b"#!python"):]
                    out.write(first)
                shutil.copyfileobj(src, out)
            mode = (info.external_attr >> 16) & 0o777
            if mode & 0o111 or script:
                os.chmod(path, mode | 0o755)
            count += 1
    return count


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    prefix, wheels = os.path.abspath(sys.argv[1]), sys.argv[2:]
    venv.EnvBuilder(with_pip=False, symlinks=True, clear=True).create(prefix)
    site = subprocess.check_output(
        [os.path.join(prefix, "bin", "python"), "-c",
         "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True).strip()
    own = dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib"))
    with open(os.path.join(site, "_base_interpreter.pth"), "w") as f:
        f.write("".join(p + "\n" for p in own if p and os.path.isdir(p)))
    for wheel in wheels:
        print(f"{os.path.basename(wheel)}: {unpack(wheel, prefix, site)} files", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
