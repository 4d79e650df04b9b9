"""Userspace "wire" for tests/support/netns.ts: one TUN device per lab host, every IPv4 packet a
host sends is delivered to the destination host's TUN after the sender's bandwidth pacing and a
one-way delay. Used where the kernel lacks sch_netem (tc delay); not a general network emulator.

Protocol: argv[1] is JSON {"names": [tun names], "delay_ms": [per tun], "rate_bps": [per tun, 0 =
unlimited], "addrs": [IPv4 per tun]}. Prints "ready" once every TUN exists; then reads commands
on stdin, one per line: "shape <index> <delay_ms> <rate_bps>". Exits when stdin closes.
"""

import fcntl
import heapq
import json
import os
import selectors
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def main() -> None:
    cfg = json.loads(sys.argv[1])
    names = cfg["names"]
    delay = [d / 1000.0 for d in cfg["delay_ms"]]
    rate = list(cfg["rate_bps"])
    by_addr = {bytes(int(x) for x in a.split(".")): i for i, a in enumerate(cfg["addrs"])}
    fds = [open_tun(n) for n in names]
    free_at = [0.0] * len(fds)  # when each sender's link finishes its last packet
    queue: list = []  # (deliver_at, seq, dst index, packet)
    seq = 0
    sel = selectors.DefaultSelector()
    for i, fd in enumerate(fds):
        sel.register(fd, selectors.EVENT_READ, i)
    sel.register(sys.stdin, selectors.EVENT_READ, -1)
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, dst, pkt = heapq.heappop(queue)
            try:
                os.write(fds[dst], pkt)
            except OSError:
                pass  # destination link down or gone: the packet is lost, as on a wire
        timeout = max(0.0, queue[0][0] - now) if queue else None
        for key, _ in sel.select(timeout):
            src = key.data
            if src == -1:
                line = sys.stdin.readline()
                if not line:
                    return
                parts = line.split()
                if len(parts) == 4 and parts[0] == "shape":
                    i = int(parts[1])
                    delay[i] = float(parts[2]) / 1000.0
                    rate[i] = float(parts[3])
                    print("ok", flush=True)
                continue
            while True:
                try:
                    pkt = os.read(fds[src], 65536)
                except BlockingIOError:
                    break
                except OSError:
                    break
                if len(pkt) < 20 or pkt[0] >> 4 != 4:
                    continue  # IPv4 only (drops IPv6 router solicitations and the like)
                dst = by_addr.get(pkt[16:20])
                if dst is None:
                    continue
                now = time.monotonic()
                start = max(now, free_at[src])
                done = start + (len(pkt) * 8 / rate[src] if rate[src] > 0 else 0.0)
                free_at[src] = done
                seq += 1
                heapq.heappush(queue, (done + delay[src], seq, dst, pkt))


if __name__ == "__main__":
    main()
