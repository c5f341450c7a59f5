"""A userspace link emulator: delay and loss on every link of a hub, for kernels without netem.

Run inside the hub network namespace of `tests/chaos/netns.py` as
``python tests/chaos/linkemu.py --delay-ms 50 --loss-pct 1 IFACE...``: it
forwards Ethernet frames between the hub's ports (the hub ends of each host's
veth pair, detached from the hub's bridge) as a learning switch, holding each
frame `delay_ms` milliseconds and dropping it with probability `loss_pct`
percent, once per frame and hop, as ``tc qdisc ... netem delay D loss L`` on
each host's egress would (a one-way delay of D). Frames keep their order per
output port. Like netem, a TCP segmentation-offload frame (up to 64 KiB, read
with its virtio-net header so the kernel segments it later) is dropped whole.

It prints ``ready`` once every port is open, then forwards until it is
signalled (SIGTERM/SIGINT) or its stdin closes (its parent is gone). Stdlib
only, so it starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import select
import signal
import socket
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
PACKET_OUTGOING = 4
VNET_HDR_LEN = 10  # struct virtio_net_hdr
BROADCAST_BIT = 0x01  # first octet of a group (broadcast/multicast) MAC address


def open_port(name: str) -> socket.socket:
    """A raw socket on port `name` reading and writing frames with their virtio-net header."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind((name, 0))
    s.setblocking(False)
    return s


class Emulator:
    """The forwarding state: ports, learned MAC addresses and frames in flight."""

    def __init__(self, ports: list[str], delay_s: float, loss: float, seed: int) -> None:
        self.socks = [open_port(p) for p in ports]
        self.delay_s = delay_s
        self.loss = loss
        self.rng = random.Random(seed)
        self.where: dict[bytes, int] = {}  # source MAC -> port index it was last seen on
        self.pending: list[tuple[float, int, int, bytes]] = []  # (due, seq, port, packet)
        self.seq = 0
        self.forwarded = 0
        self.dropped = 0

    def receive(self, index: int) -> None:
        """Read every frame waiting on port `index` (bounded by the socket's queue)."""
        sock = self.socks[index]
        for _ in range(1024):
            try:
                packet, addr = sock.recvfrom(65536 + VNET_HDR_LEN + 64)
            except BlockingIOError:
                return
            if addr[2] == PACKET_OUTGOING or len(packet) < VNET_HDR_LEN + 14:
                continue
            frame = packet[VNET_HDR_LEN:]
            dst, src = frame[0:6], frame[6:12]
            if not src[0] & BROADCAST_BIT:
                self.where[src] = index
            if self.loss > 0 and self.rng.random() < self.loss:
                self.dropped += 1
                continue
            out = self.where.get(dst) if not dst[0] & BROADCAST_BIT else None
            targets = [out] if out is not None else range(len(self.socks))
            due = time.monotonic() + self.delay_s
            for t in targets:
                if t != index:
                    self.seq += 1
                    heapq.heappush(self.pending, (due, self.seq, t, packet))

    def deliver(self) -> None:
        """Send every frame whose delay has passed."""
        now = time.monotonic()
        while self.pending and self.pending[0][0] <= now:
            _, _, port, packet = heapq.heappop(self.pending)
            try:
                self.socks[port].send(packet)
                self.forwarded += 1
            except OSError:
                self.dropped += 1  # a full queue or a frame the port refuses: lost

    def next_timeout(self) -> float:
        if not self.pending:
            return 1.0
        return max(0.0, self.pending[0][0] - time.monotonic())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ports", nargs="+")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--loss-pct", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    emu = Emulator(args.ports, args.delay_ms / 1000.0, args.loss_pct / 100.0, args.seed)
    stdin = sys.stdin.fileno()
    print("ready", flush=True)
    while not stop:  # ends on a signal or when the parent closes our stdin
        try:
            readable, _, _ = select.select([*emu.socks, stdin], [], [], emu.next_timeout())
        except InterruptedError:
            continue
        if stdin in readable and not os.read(stdin, 4096):
            break
        for i, s in enumerate(emu.socks):
            if s in readable:
                emu.receive(i)
        emu.deliver()
    print(f"forwarded {emu.forwarded} dropped {emu.dropped}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
