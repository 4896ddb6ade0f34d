"""Test helpers for real processes in Linux network namespaces (federation tests: one domain's
gateway per namespace, links with delay, loss and cuts), and :class:`DelayProxy`, a delaying
TCP proxy on 127.0.0.1 for where namespaces cannot be made.

A :class:`Topology` is one small LAN of the run's own::

    root namespace    bridge arx<tag>b, 10.X.Y.1/24: the test process, a directory service
                          |  port arx<tag>r<i> (a tap)
                      the shaper (a thread of the test process): delay, loss, cut, each way
                          |  eth0 (a tap, moved into the namespace)
    namespace arx-<tag>-<name>    10.X.Y.<i+2>/24, and lo up

Why taps and a shaper in user space, not veth and ``tc netem``: kernels built without
sch_netem (CONFIG_NET_SCH_NETEM, as on the machine this was written on) have no delay at all,
and in user space the shaping means exactly what it says, the same on every kernel.

What holds:
- Every name carries its owner's tag (pid and a letter): ``arx-<tag>-<name>`` for a namespace
  (no length limit), ``arx<tag>b`` / ``arx<tag>r<i>`` / ``arx<tag>n<i>`` for interfaces (at most
  15 characters). Entering a topology first removes what dead pids left (namespaces, with
  whatever still runs in them, and bridges; taps die with the process that held them).
- The range 10.X.Y.0/24 is chosen from the pid, under a file lock, among ranges that overlap no
  address or route of the root namespace: parallel pytest-xdist workers never share one.
- Shaping applies to IP frames only (IPv4 and IPv6); ARP always passes, undelayed and never
  lost, so that a cut never turns into "no route to host" once the neighbour entry fails (a
  cut wide-area link does not make the next hop vanish either). See :class:`LinkShape`.
- Leaving the topology, even on failure, stops every process it started, kills whatever else
  runs in its namespaces, and removes the namespaces, taps and bridge.

Processes inside a namespace cannot reach 127.0.0.1 of the root namespace (Redis, NATS there):
gateways in namespaces use the memory registry, and :func:`ns_gateway` applies neither of
tests/support.py's switches.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import functools
import ipaddress
import os
import random
import re
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit

from tests.support import ROOT, Proc, _start

PREFIX = "arx"
# what a process started in a namespace prints: its URL on any IPv4 address (group 1), or
# where an agent on NATS listens (group 2), as tests/support.py's own pattern
ANY_URL = re.compile(rb"(http://\d{1,3}(?:\.\d{1,3}){3}:\d+\S*)| at (nats:\S+)")
MAX_HOSTS = 99  # "arx" + pid (7) + letter + "r" + 2 digits: 15 characters at most
_LOCK = Path("/run/agent-reach-netns.lock")
_NS_NAME = re.compile(rf"^{PREFIX}-(\d+)[a-z]-")
_LINK_NAME = re.compile(rf"^{PREFIX}(\d+)[a-z][bnr]\d*$")
_HOST_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
# 10.X.Y.0/24 for X in 100..254: where a run's range is looked for
_RANGES = 155 * 256
_ROUTE_TYPES = {"unicast", "local", "broadcast", "multicast", "anycast", "unreachable"}
_ROUTE_TYPES |= {"blackhole", "prohibit", "throw", "nat"}
_TUNSETIFF = 0x400454CA
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
_ETH_IPV4 = 0x0800
_ETH_IPV6 = 0x86DD
_TCP_FIN, _TCP_SYN, _TCP_RST, _TCP_ACK = 0x01, 0x02, 0x04, 0x10
_QUEUE_LIMIT = 10_000  # frames held per direction of a delayed link; more are dropped
_tags_in_use: set[str] = set()
_tags_lock = threading.Lock()


def _ip(*args: str, check: bool = True) -> str:
    """``ip ARGS``; its stdout. Raises RuntimeError, with ip's own words, when it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=15, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _open_tap(name: str) -> int:
    """A new tap device ``name`` (no packet info header), as a non-blocking fd; the device
    lives as long as the fd is open."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH22x", name.encode(), _IFF_TAP | _IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


@functools.cache
def netns_available() -> tuple[bool, str]:
    """Whether a :class:`Topology` can be made here, and why not when it cannot (a skip
    reason): Linux, root, ``ip``, ``ip netns add`` and a tap device all working. Probed once
    per process."""
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces need Linux, not {sys.platform}"
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    if not os.access("/dev/net/tun", os.R_OK | os.W_OK):
        return False, "no /dev/net/tun (a topology's links are tap devices)"
    name = f"{PREFIX}-{os.getpid()}z-probe"
    try:
        _ip("netns", "add", name)
    except (OSError, RuntimeError) as exc:  # no ip binary (apt-get install iproute2), or no
        return False, f"cannot make a network namespace: {exc}"
    try:
        os.close(_open_tap(f"{PREFIX}{os.getpid()}zn"))
    except OSError as exc:
        return False, f"cannot make a tap device: {exc}"
    finally:
        _ip("netns", "del", name, check=False)
    return True, ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _netns_list() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _link_names() -> list[str]:
    """The interface names of the root namespace (without the ``@peer`` part)."""
    names = []
    for line in _ip("-o", "link", "show").splitlines():
        parts = line.split(": ", 2)
        if len(parts) >= 2:
            names.append(parts[1].split("@")[0])
    return names


def _kill_inside(netns: str, bound: float = 5.0) -> None:
    """SIGKILL whatever runs in ``netns``; wait (bounded) until it is gone."""
    deadline = time.monotonic() + bound
    while True:
        pids = [int(p) for p in _ip("netns", "pids", netns, check=False).split()]
        if not pids:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in {netns} outlived SIGKILL for {bound} s")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)  # polling interval for the kernel to reap them, not a settle delay


def remove_leftovers() -> list[str]:
    """Remove the namespaces and interfaces of this prefix whose owning pid is dead (a run
    that crashed); returns what it removed. Live owners' names are left alone."""
    removed = []
    for netns in _netns_list():
        match = _NS_NAME.match(netns)
        if match and not _pid_alive(int(match.group(1))):
            _kill_inside(netns)
            _ip("netns", "del", netns, check=False)
            removed.append(netns)
    for link in _link_names():
        match = _LINK_NAME.match(link)
        if match and not _pid_alive(int(match.group(1))):
            _ip("link", "del", link, check=False)
            removed.append(link)
    return removed


def _free_range(start: int) -> ipaddress.IPv4Network:
    """The first 10.X.Y.0/24 from ``start`` on that overlaps no address or route here."""
    taken = []
    for line in _ip("-o", "-4", "addr", "show").splitlines():
        fields = line.split()
        if "inet" in fields:
            taken.append(ipaddress.ip_network(fields[fields.index("inet") + 1], strict=False))
    for line in _ip("-4", "route", "show", "table", "all").splitlines():
        words = line.split()
        if words and words[0] in _ROUTE_TYPES:
            words = words[1:]
        if words and words[0] != "default":  # a default route overlaps everything
            with contextlib.suppress(ValueError):
                taken.append(ipaddress.ip_network(words[0], strict=False))
    for step in range(_RANGES):
        index = (start + step) % _RANGES
        candidate = ipaddress.IPv4Network(f"10.{100 + index // 256}.{index % 256}.0/24")
        if not any(candidate.overlaps(net) for net in taken):
            return candidate
    raise RuntimeError("no free 10.X.Y.0/24 range for a topology")


@contextmanager
def _locked() -> Iterator[None]:
    """The machine-wide lock under which ranges are chosen and leftovers removed."""
    with _LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- the shaper --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkShape:
    """What one host's link does to IP frames (ARP always passes, at once).

    - ``delay_ms``: each frame is delivered that long after it arrived, in EACH direction, in
      order: a round trip between the host and the root namespace grows by 2 x ``delay_ms``, one
      between two hosts by 2 x (the sum of their two delays). A TCP connect costs one round trip.
    - ``loss_percent``: each frame is dropped with that chance, each direction on its own (10 %
      loses about 19 % of round trips); TCP retransmits, after its own timeouts.
    - ``cut="drop"``: every frame is dropped, those already delayed in the link too: a connect
      to or from the host TIMES OUT (SYNs unanswered), open connections stall.
    - ``cut="refuse"``: every TCP segment is answered with a RST from the far side, in the
      link: a connect fails at once (ECONNREFUSED), an open connection is reset when it next
      sends; other IP frames are dropped.
    """

    delay_ms: float = 0.0
    loss_percent: float = 0.0
    cut: Literal["drop", "refuse"] | None = None


@dataclass
class LinkStats:
    """What a link did so far (for a test's diagnostics): frames it passed on, dropped (loss,
    cut, full queue, a write the device refused) and answered with a RST."""

    forwarded: int = 0
    dropped: int = 0
    reset: int = 0


class _Link:
    """One host's link: a tap in its namespace, a tap in the bridge, and what lies between."""

    def __init__(self, name: str, ns_fd: int, root_fd: int) -> None:
        self.name = name
        self.ns_fd = ns_fd
        self.root_fd = root_fd
        self.shape = LinkShape()  # replaced whole (frozen), so the shaper reads it unlocked
        self.stats = LinkStats()
        # keyed by the fd a frame goes to: (due, frame), due times never decreasing
        self.queues: dict[int, deque[tuple[float, bytes]]] = {ns_fd: deque(), root_fd: deque()}
        self.last_due: dict[int, float] = {ns_fd: 0.0, root_fd: 0.0}


def _is_ip(frame: bytes) -> bool:
    return len(frame) >= 14 and int.from_bytes(frame[12:14], "big") in (_ETH_IPV4, _ETH_IPV6)


def _checksum(data: bytes) -> int:
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def reset_for(frame: bytes) -> bytes | None:
    """The Ethernet frame of the RST a refusing peer answers this IPv4 TCP segment with (RFC
    9293 3.10.7.1), or None when there is none to send (not TCP over IPv4, a fragment, a RST)."""
    if len(frame) < 34 or int.from_bytes(frame[12:14], "big") != _ETH_IPV4:
        return None
    if frame[14] >> 4 != 4 or frame[23] != 6 or int.from_bytes(frame[20:22], "big") & 0x3FFF:
        return None  # not IPv4, not TCP, or a fragment
    ihl = (frame[14] & 0x0F) * 4
    tcp = 14 + ihl
    if len(frame) < tcp + 20:
        return None
    sport, dport, seq, ack = struct.unpack_from("!HHII", frame, tcp)
    offset, flags = (frame[tcp + 12] >> 4) * 4, frame[tcp + 13]
    if flags & _TCP_RST:
        return None
    if flags & _TCP_ACK:
        r_seq, r_ack, r_flags = ack, 0, _TCP_RST
    else:
        length = int.from_bytes(frame[16:18], "big") - ihl - offset
        length += bool(flags & _TCP_SYN) + bool(flags & _TCP_FIN)
        r_seq, r_ack, r_flags = 0, (seq + length) & 0xFFFFFFFF, _TCP_RST | _TCP_ACK
    src, dst = frame[26:30], frame[30:34]
    segment = struct.pack("!HHIIBBHHH", dport, sport, r_seq, r_ack, 5 << 4, r_flags, 0, 0, 0)
    pseudo = dst + src + struct.pack("!BBH", 0, 6, len(segment))
    segment = segment[:16] + struct.pack("!H", _checksum(pseudo + segment)) + segment[18:]
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 0, 0x4000, 64, 6, 0, dst, src)
    header = header[:10] + struct.pack("!H", _checksum(header)) + header[12:]
    return frame[6:12] + frame[0:6] + frame[12:14] + header + segment


class _Shaper:
    """One thread passing frames between each link's two taps, shaped by the link's
    :class:`LinkShape`. A failure stops it and is kept in ``failure`` (the topology raises it
    on exit); nothing is forwarded any more after one."""

    def __init__(self, links: Sequence[_Link], seed: int | None) -> None:
        self._links = list(links)
        self._peer: dict[int, tuple[_Link, int]] = {}
        for link in self._links:
            self._peer[link.ns_fd] = (link, link.root_fd)
            self._peer[link.root_fd] = (link, link.ns_fd)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._stopping = False
        self._random = random.Random(seed)
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="netns-shaper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread.ident is not None:
            self._thread.join(5.0)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # kept for the topology to raise on exit
            self.failure = exc

    def _loop(self) -> None:
        fds = [*self._peer, self._wake_r]
        while not self._stopping:
            due = min(
                (q[0][0] for link in self._links for q in link.queues.values() if q),
                default=None,
            )
            timeout = None if due is None else max(0.0, due - time.monotonic())
            readable, _, _ = select.select(fds, [], [], timeout)
            for fd in readable:
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 64)
                else:
                    self._receive(fd)
            self._deliver(time.monotonic())

    def _receive(self, fd: int) -> None:
        link, dest = self._peer[fd]
        for _ in range(256):  # then the other fds get their turn
            try:
                frame = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EIO, errno.ENETDOWN):  # the device is down
                    return
                raise
            self._pass(link, fd, dest, frame)

    def _pass(self, link: _Link, source: int, dest: int, frame: bytes) -> None:
        shape = link.shape
        if not _is_ip(frame):  # ARP and the like: the link layer is never shaped
            self._write(link, dest, frame)
            return
        if shape.cut == "refuse":
            reply = reset_for(frame)
            link.stats.dropped += reply is None
            if reply is not None:
                link.stats.reset += 1
                self._write(link, source, reply)
            return
        lost = shape.loss_percent > 0 and self._random.random() * 100 < shape.loss_percent
        if shape.cut == "drop" or lost:
            link.stats.dropped += 1
            return
        queue = link.queues[dest]
        if shape.delay_ms <= 0 and not queue:
            self._write(link, dest, frame)
            return
        if len(queue) >= _QUEUE_LIMIT:
            link.stats.dropped += 1
            return
        due = max(time.monotonic() + shape.delay_ms / 1000, link.last_due[dest])
        link.last_due[dest] = due
        queue.append((due, frame))

    def _deliver(self, now: float) -> None:
        for link in self._links:
            for dest, queue in link.queues.items():
                while queue and queue[0][0] <= now:
                    _, frame = queue.popleft()
                    if link.shape.cut is not None:  # cut while in flight: lost
                        link.stats.dropped += 1
                    else:
                        self._write(link, dest, frame)

    @staticmethod
    def _write(link: _Link, fd: int, frame: bytes) -> None:
        try:
            os.write(fd, frame)
        except OSError as exc:  # a device down or full drops the frame, as a wire would
            if exc.errno not in (errno.EIO, errno.ENETDOWN, errno.EAGAIN, errno.ENOBUFS):
                raise
            link.stats.dropped += 1
        else:
            link.stats.forwarded += 1


# --- the topology ------------------------------------------------------------------------------


def _new_tag() -> str:
    with _tags_lock:
        for letter in "abcdefghijklmnopqrstuvwxy":  # z: netns_available's probe
            tag = f"{os.getpid()}{letter}"
            if tag not in _tags_in_use:
                _tags_in_use.add(tag)
                return tag
    raise RuntimeError("25 topologies open at once in one process")


class Topology:
    """Namespaces ``names``, each with a shaped link into one bridge of the root namespace;
    a context manager (see the module docstring for the layout and what holds).

    ``seed`` makes :meth:`loss` drop the same frames run after run (given the same traffic).
    """

    def __init__(self, names: Sequence[str], *, seed: int | None = None) -> None:
        if not names or len(set(names)) != len(names) or len(names) > MAX_HOSTS:
            raise ValueError(f"1 to {MAX_HOSTS} distinct host names, got {list(names)}")
        for name in names:
            if not _HOST_NAME.match(name):
                raise ValueError(f"host name {name!r}: [a-z0-9][a-z0-9-]{{0,30}}")
        self.names = list(names)
        self._seed = seed
        self._tag = ""
        self._network: ipaddress.IPv4Network | None = None
        self._bridge = ""
        self._netns: dict[str, str] = {}
        self._links: dict[str, _Link] = {}
        self._fds: list[int] = []
        self._shaper: _Shaper | None = None
        self._procs: list[subprocess.Popen[bytes]] = []

    # -- lifetime

    def __enter__(self) -> Topology:
        try:
            self._up()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _up(self) -> None:
        self._tag = _new_tag()
        self._bridge = f"{PREFIX}{self._tag}b"
        with _locked():
            remove_leftovers()
            self._network = _free_range(os.getpid() * 26 + ord(self._tag[-1]) - ord("a"))
            _ip("link", "add", self._bridge, "type", "bridge")
            _ip("addr", "add", f"{self.root_ip}/24", "dev", self._bridge)
            _ip("link", "set", self._bridge, "up")
        for i, name in enumerate(self.names):
            netns = f"{PREFIX}-{self._tag}-{name}"
            _ip("netns", "add", netns)
            self._netns[name] = netns
            inner, outer = f"{PREFIX}{self._tag}n{i}", f"{PREFIX}{self._tag}r{i}"
            ns_fd = _open_tap(inner)
            self._fds.append(ns_fd)
            root_fd = _open_tap(outer)
            self._fds.append(root_fd)
            self._links[name] = _Link(name, ns_fd, root_fd)
            _ip("link", "set", inner, "netns", netns)
            _ip("-n", netns, "link", "set", inner, "name", "eth0")
            _ip("-n", netns, "addr", "add", f"{self.ip(name)}/24", "dev", "eth0")
            _ip("-n", netns, "link", "set", "eth0", "up")
            _ip("-n", netns, "link", "set", "lo", "up")
            _ip("link", "set", outer, "master", self._bridge, "up")
        self._shaper = _Shaper(list(self._links.values()), self._seed)
        self._shaper.start()

    def close(self) -> None:
        """Stop every process, remove the namespaces, taps and bridge (idempotent); raises
        afterwards if a step failed or the shaper had died."""
        problems: list[str] = []
        for popen in self._procs:
            _stop_popen(popen)
        self._procs.clear()
        for netns in self._netns.values():
            try:
                _kill_inside(netns)
            except RuntimeError as exc:
                problems.append(str(exc))
        failure = None
        if self._shaper is not None:
            self._shaper.stop()
            failure, self._shaper = self._shaper.failure, None
        for fd in self._fds:  # the taps go with their fds
            os.close(fd)
        self._fds.clear()
        for netns in self._netns.values():
            try:
                _ip("netns", "del", netns)
            except RuntimeError as exc:
                problems.append(str(exc))
        self._netns.clear()
        if self._bridge and self._bridge in _link_names():
            try:
                _ip("link", "del", self._bridge)
            except RuntimeError as exc:
                problems.append(str(exc))
        with _tags_lock:
            _tags_in_use.discard(self._tag)
        if failure is not None:
            raise RuntimeError(f"the topology's shaper failed: {failure!r}") from failure
        if problems:
            raise RuntimeError("; ".join(problems))

    # -- addresses

    @property
    def tag(self) -> str:
        """What this topology's names carry (pid and a letter)."""
        return self._tag

    @property
    def network(self) -> ipaddress.IPv4Network:
        """The topology's 10.X.Y.0/24."""
        if self._network is None:
            raise RuntimeError("the topology is not up")
        return self._network

    @property
    def root_ip(self) -> str:
        """The bridge's address in the root namespace (10.X.Y.1): where a service of the root
        namespace listens to be reachable from the hosts."""
        return str(self.network.network_address + 1)

    def ip(self, name: str | None) -> str:
        """The address of host ``name`` (10.X.Y.2, .3, ... in the order given); None: the root
        namespace's (:attr:`root_ip`)."""
        if name is None:
            return self.root_ip
        return str(self.network.network_address + 2 + self._index(name))

    def netns(self, name: str) -> str:
        """The namespace's name, as ``ip netns`` knows it."""
        self._index(name)
        return f"{PREFIX}-{self._tag}-{name}"

    def _index(self, name: str) -> int:
        if name not in self.names:
            raise KeyError(f"no host {name!r} in {self.names}")
        return self.names.index(name)

    # -- processes

    def argv(self, name: str | None, argv: Sequence[str]) -> list[str]:
        """``argv`` to run inside host ``name``'s namespace (``ip netns exec`` execs it: the
        process is ``argv`` itself, signals reach it); None: in the root namespace."""
        if name is None:
            return list(argv)
        return ["ip", "netns", "exec", self.netns(name), *argv]

    def popen(
        self, name: str | None, argv: Sequence[str], **kwargs: Any
    ) -> subprocess.Popen[bytes]:
        """``subprocess.Popen`` of ``argv`` in host ``name``'s namespace (cwd: the repository);
        stopped, if still running, when the topology closes."""
        kwargs.setdefault("cwd", ROOT)
        popen: subprocess.Popen[bytes] = subprocess.Popen(self.argv(name, argv), **kwargs)
        self._procs.append(popen)
        return popen

    def run(
        self, name: str | None, argv: Sequence[str], *, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` in host ``name``'s namespace, to completion (bounded), output captured."""
        return subprocess.run(
            self.argv(name, argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
            check=False,
        )

    def start(
        self,
        name: str | None,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        timeout: float = 15.0,
    ) -> Proc:
        """A :class:`tests.support.Proc` of ``argv`` in host ``name``'s namespace, returned once
        it printed its URL (on any IPv4 address, or an agent's NATS subject), as
        tests/support.py's own processes; stopped when the topology closes if not before."""
        proc = _start(self.argv(name, argv), timeout, env=env, pattern=ANY_URL)
        self._procs.append(proc.popen)
        return proc

    # -- shaping

    def shape(self, name: str) -> LinkShape:
        """Host ``name``'s link shape now."""
        return self._link(name).shape

    def stats(self, name: str) -> LinkStats:
        """What host ``name``'s link did so far."""
        return self._link(name).stats

    def delay(self, name: str, ms: float) -> None:
        """Delay IP frames ``ms`` EACH WAY on host ``name``'s link (RTT + 2 x ``ms``)."""
        if ms < 0:
            raise ValueError(f"delay must be >= 0 ms, got {ms}")
        self._reshape(name, delay_ms=float(ms))

    def loss(self, name: str, percent: float) -> None:
        """Drop each IP frame with chance ``percent`` %, each way on host ``name``'s link."""
        if not 0 <= percent <= 100:
            raise ValueError(f"loss must be 0..100 %, got {percent}")
        self._reshape(name, loss_percent=float(percent))

    def cut(self, name: str, *, refuse: bool = False) -> None:
        """Cut host ``name``'s link: connects time out (``refuse``: fail at once, as refused);
        see :class:`LinkShape`. Delay and loss are kept for :meth:`restore`."""
        self._reshape(name, cut="refuse" if refuse else "drop")

    def restore(self, name: str) -> None:
        """Undo :meth:`cut` (the delay and loss set before stay)."""
        self._reshape(name, cut=None)

    def clear(self, name: str) -> None:
        """No delay, loss or cut on host ``name``'s link."""
        self._link(name).shape = LinkShape()

    def _reshape(self, name: str, **change: Any) -> None:
        link = self._link(name)
        link.shape = dataclasses.replace(link.shape, **change)

    def _link(self, name: str) -> _Link:
        self._index(name)
        if self._shaper is None or not self._shaper.alive():
            failure = self._shaper.failure if self._shaper else None
            raise RuntimeError(f"the topology's shaper is not running ({failure!r})")
        return self._links[name]


def _stop_popen(popen: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    if popen.poll() is None:
        popen.terminate()
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(timeout)
    for pipe in (popen.stdin, popen.stdout, popen.stderr):
        if pipe is not None:
            pipe.close()


@contextmanager
def ns_gateway(
    topo: Topology, name: str | None, *flags: str, timeout: float = 15.0
) -> Iterator[Proc]:
    """A real ``agent-reach serve`` in host ``name``'s namespace (None: the root namespace, on
    the bridge's address), as :func:`tests.support.gateway` starts one: on ``--host`` its
    address, ``--port 0`` and ``--insecure-open-mode`` (open mode off loopback) unless
    ``flags`` say otherwise (``--auth`` drops the latter). Neither switch of tests/support.py
    applies: the registry is the memory one unless ``flags`` name another."""
    host = [] if "--host" in flags else ["--host", topo.ip(name)]
    port = [] if "--port" in flags else ["--port", "0"]
    opened = [] if {"--insecure-open-mode", "--auth"} & set(flags) else ["--insecure-open-mode"]
    cmd = [sys.executable, "-m", "agent_reach", "serve", *host, *port, *opened, *flags]
    proc = topo.start(name, cmd, timeout=timeout)
    try:
        yield proc
    finally:
        proc.stop()


# --- the loopback stand-in ---------------------------------------------------------------------


class DelayProxy:
    """A TCP proxy on 127.0.0.1 (a port of its own) to ``target`` (``http://host:port`` or
    ``(host, port)``), for scenarios on loopback where namespaces cannot be made; a context
    manager, run by an event loop in a thread of its own (usable from sync and async tests).

    - Every byte is delivered ``delay_ms`` after the proxy read it, each way, in order: a
      request and its answer take 2 x ``delay_ms`` more. The TCP handshake with the proxy, and
      the proxy's own connect to ``target``, are NOT delayed (unlike a :class:`Topology` link,
      where a connect costs a round trip).
    - :meth:`cut`: nothing is forwarded any more, either way, and new connections are held
      (accepted by the kernel, not connected on): requests hang. :meth:`restore` resumes them,
      what was sent meanwhile included (as TCP retransmission would). ``cut(refuse=True)``:
      every connection is aborted and the port stops listening, so connects are refused at
      once; :meth:`restore` listens again on the same port.
    - At most ``max_connections`` at a time (held ones count); more are closed at once and
      counted in ``rejected``.
    """

    def __init__(
        self,
        target: str | tuple[str, int],
        *,
        delay_ms: float = 0.0,
        max_connections: int = 64,
    ) -> None:
        if isinstance(target, str):
            parts = urlsplit(target)
            if parts.hostname is None or parts.port is None:
                raise ValueError(f"target {target!r}: need http://host:port")
            target = (parts.hostname, parts.port)
        self.target = target
        self._delay = delay_ms / 1000
        self._max = max_connections
        self.port = 0
        self.rejected = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="delay-proxy", daemon=True
        )
        self._server: asyncio.Server | None = None
        self._open: asyncio.Event | None = None  # set: forwarding (made on the loop)
        self._conns: dict[asyncio.Task[None], list[asyncio.StreamWriter]] = {}

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: the proxy's address, as a gateway URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def active(self) -> int:
        """Connections in hand now (held ones included)."""
        return len(self._conns)

    def __enter__(self) -> DelayProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Listen (returns once it does)."""
        self._thread.start()
        try:
            self._call(self._listen(0))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop listening, abort every connection, stop the thread (idempotent)."""
        if self._loop.is_closed():
            return
        if self._thread.is_alive():
            self._call(self._shutdown())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
        self._loop.close()

    def set_delay(self, ms: float) -> None:
        """The delay, each way, of what is read from now on."""
        if ms < 0:
            raise ValueError(f"delay must be >= 0 ms, got {ms}")
        self._delay = ms / 1000

    def cut(self, *, refuse: bool = False) -> None:
        """Stop forwarding (connections hang); ``refuse``: abort them and stop listening."""
        self._call(self._cut(refuse))

    def restore(self) -> None:
        """Forward again (and listen again after a refusing cut)."""
        self._call(self._restore())

    def _call(self, coro: Any) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10.0)

    async def _listen(self, port: int) -> None:
        if self._open is None:
            self._open = asyncio.Event()
            self._open.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _cut(self, refuse: bool) -> None:
        assert self._open is not None
        self._open.clear()
        if refuse:
            await self._stop_listening()
            await self._abort_all()

    async def _restore(self) -> None:
        assert self._open is not None
        if self._server is None:
            await self._listen(self.port)
        self._open.set()

    async def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _abort_all(self) -> None:
        conns = list(self._conns.items())
        for task, _ in conns:
            task.cancel()
        await asyncio.gather(*(task for task, _ in conns), return_exceptions=True)
        for task, writers in conns:  # a task cancelled before it ran never reached its finally
            self._conns.pop(task, None)
            for w in writers:
                w.transport.abort()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection, tracked from the moment it is accepted: its relay's task is ours
        (not asyncio's, whose 3.11 done-callback raises for a cancelled task), so that a stop
        right after the accept still aborts its socket."""
        if len(self._conns) >= self._max:
            self.rejected += 1
            writer.transport.abort()
            return
        task = asyncio.get_running_loop().create_task(self._handle(reader, writer))
        self._conns[task] = [writer]

    async def _shutdown(self) -> None:
        await self._stop_listening()
        await self._abort_all()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None and self._open is not None
        writers = self._conns[task]  # [writer], registered by _accept
        clean = False
        try:  # tracked in _conns until its sockets are closed: a stop meanwhile aborts them
            try:
                await self._open.wait()  # a cut holds new connections too
                try:
                    up_reader, up_writer = await asyncio.open_connection(*self.target)
                except OSError:
                    return  # the target is not there: the client sees its connection closed
                writers.append(up_writer)
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._pump(reader, up_writer))
                    group.create_task(self._pump(up_reader, writer))
                clean = True
            except* OSError:
                pass  # a reset on either side ends the relay; both sides are aborted below
            finally:
                for w in writers:
                    if not clean:
                        w.transport.abort()
            for w in writers:  # both directions ended: flush what is left, then close
                w.close()
                with contextlib.suppress(OSError):
                    await w.wait_closed()
        finally:
            self._conns.pop(task, None)

    async def _pump(self, source: asyncio.StreamReader, dest: asyncio.StreamWriter) -> None:
        """``source`` to ``dest``, each chunk ``delay`` after it was read, in order."""
        assert self._open is not None
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=64)

        async def receive() -> None:
            assert self._open is not None
            last = 0.0
            while True:
                await self._open.wait()
                data = await source.read(65536)
                last = max(loop.time() + self._delay, last)
                await queue.put((last, data))
                if not data:
                    return

        async def send() -> None:
            assert self._open is not None
            while True:
                due, data = await queue.get()
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                await self._open.wait()
                if not data:
                    if dest.can_write_eof():
                        dest.write_eof()
                    return
                dest.write(data)
                await dest.drain()

        async with asyncio.TaskGroup() as group:
            group.create_task(receive())
            group.create_task(send())


__all__ = [
    "ANY_URL",
    "DelayProxy",
    "LinkShape",
    "LinkStats",
    "Topology",
    "netns_available",
    "ns_gateway",
    "remove_leftovers",
    "reset_for",
]
