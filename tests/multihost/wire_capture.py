"""Read every frame on a namespace host's ``eth0`` (an AF_PACKET socket, as tcpdump does)
until a stop file appears or a deadline passes; print how many bytes went by and how many
frames carried the marker. argv: marker text, stop file, seconds."""
import json
import os
import socket
import sys
import time

marker, stop, seconds = sys.argv[1].encode(), sys.argv[2], float(sys.argv[3])
ETH_P_ALL = 0x0003
sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
sock.bind(("eth0", 0))
sock.settimeout(0.1)
print("capturing", flush=True)
seen = found = 0
deadline = time.monotonic() + seconds
while time.monotonic() < deadline and not os.path.exists(stop):
    try:
        frame = sock.recv(1 << 17)
    except TimeoutError:
        continue
    seen += len(frame)
    found += marker in frame
print(json.dumps({"bytes": seen, "marker_frames": found}), flush=True)
