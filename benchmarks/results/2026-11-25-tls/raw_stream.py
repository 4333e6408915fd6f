"""One process, two threads: 256 MiB through a TLS 1.3 socket pair and through a plain one,
in 256 KiB writes (what Python's ssl module gives, without pycoll). Certificates: made with
``pycoll.testing.certs``. Run: PYTHONPATH=. python benchmarks/results/2026-11-25-tls/raw_stream.py
"""
import socket
import ssl
import tempfile
import threading
import time
from pathlib import Path

from pycoll.testing.certs import make_job_certificates
from rendezvous.tls import TlsFiles

N, WRITE = 256 << 20, 256 << 10


def stream(tx: socket.socket, rx: socket.socket) -> float:
    def read() -> None:
        view, got = memoryview(bytearray(1 << 20)), 0
        while got < N:
            got += rx.recv_into(view)
    reader = threading.Thread(target=read)
    reader.start()
    data, start = memoryview(bytearray(N)), time.perf_counter()
    for off in range(0, N, WRITE):
        tx.sendall(data[off:off + WRITE])
    reader.join()
    return N / (time.perf_counter() - start) / 1e9


with tempfile.TemporaryDirectory() as tmp:
    env = make_job_certificates(Path(tmp), ["r"])["r"]
    files = TlsFiles(env["PYCOLL_TLS_CERT"], env["PYCOLL_TLS_KEY"], env["PYCOLL_TLS_CA"])
    a, b = socket.socketpair()
    server = files.server_context().wrap_socket(a, server_side=True,
                                                do_handshake_on_connect=False)
    client = files.client_context().wrap_socket(b, do_handshake_on_connect=False)
    shake = threading.Thread(target=server.do_handshake)
    shake.start()
    client.do_handshake()
    shake.join()
    print(ssl.OPENSSL_VERSION, client.cipher())
    print(f"TLS   {stream(client, server):.3f} GB/s")
    print(f"plain {stream(*socket.socketpair()):.3f} GB/s")
