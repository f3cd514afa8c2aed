"""A DNS server that knows no name: every query gets NXDOMAIN. The far site
of preload_test.go runs it as its resolver, so a name the site does not
know is "no such host" at once, as on a network with DNS, rather than a
timeout.

usage: nxdomain.py ADDRESS
"""

import socket
import sys

s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 53))
print("listening", flush=True)
while True:
    q, peer = s.recvfrom(4096)
    if len(q) < 12:
        continue
    # The first question, copied back: its name, then type and class.
    i = 12
    while i < len(q) and q[i] != 0:
        i += q[i] + 1
    question = q[12:i + 5]
    # QR, the query's opcode and RD; RA and RCODE 3 (NXDOMAIN); one
    # question, no records.
    flags = bytes([0x80 | (q[2] & 0x79), 0x83])
    s.sendto(q[:2] + flags + b"\x00\x01" + b"\x00" * 6 + question, peer)
