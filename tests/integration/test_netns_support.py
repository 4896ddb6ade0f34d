"""tests/netns_support.py itself: a gateway in a network namespace, reached from the root
namespace and from another namespace; a link's delay, loss and cuts as a client sees them; a
topology that leaves nothing behind (and clears what a crashed run left); and the loopback
stand-in, DelayProxy, in front of a real gateway.

The namespace tests skip, with the reason, where namespaces cannot be made (not root, no tap
devices); the DelayProxy tests run everywhere. Margins are honest: a delay is a floor (each
sample at least 90 % of it), the ceilings are loose (a few x), a cut's timeout is the client's.
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.netns_support import DelayProxy, Topology, netns_available, ns_gateway
from tests.support import Proc, gateway, http, wait_until

HOSTS = ["beijing", "shanghai", "chengdu"]
REQUEST = b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"


def _need_netns() -> None:
    ok, why = netns_available()
    if not ok:
        pytest.skip(why)


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None, url
    return parts.hostname, parts.port


def _connect_ms(address: tuple[str, int], timeout: float = 5.0) -> float:
    """How long a TCP connect to ``address`` takes, in ms (one round trip)."""
    start = time.monotonic()
    with socket.create_connection(address, timeout=timeout):
        pass
    return (time.monotonic() - start) * 1000


def _get_ms(url: str) -> float:
    """How long a GET of ``url`` on a new connection takes, in ms; it must answer 200."""
    start = time.monotonic()
    status, body = http("GET", url, timeout=10)
    assert status == 200, body
    return (time.monotonic() - start) * 1000


@pytest.fixture(scope="module")
def lan() -> Iterator[tuple[Topology, Proc]]:
    """Three namespaces, and a gateway in beijing's."""
    _need_netns()
    with Topology(HOSTS, seed=7) as topo, ns_gateway(topo, "beijing") as gw:
        yield topo, gw


@pytest.fixture
def net(lan: tuple[Topology, Proc]) -> Iterator[tuple[Topology, Proc]]:
    """:func:`lan`, every link unshaped again afterwards (whatever the test did)."""
    yield lan
    for name in HOSTS:
        lan[0].clear(name)


# --- namespaces ------------------------------------------------------------------------------


def test_a_gateway_in_a_namespace_answers_by_its_address(net: tuple[Topology, Proc]) -> None:
    topo, gw = net
    host, port = _address(gw.url)
    assert host == topo.ip("beijing")
    assert str(topo.network) == f"{topo.root_ip.rsplit('.', 1)[0]}.0/24"
    assert len({topo.root_ip, *(topo.ip(n) for n in HOSTS)}) == 4

    status, body = http("GET", f"{gw.url}/healthz", timeout=5)
    assert status == 200, body
    # it is not in the root namespace: nothing listens on that port here
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert any(line.get("event") == "gateway.listening" for line in gw.log_lines())

    # another namespace reaches it over the bridge
    fetch = f"import urllib.request as u; print(u.urlopen('{gw.url}/healthz', timeout=5).status)"
    done = topo.run("shanghai", [sys.executable, "-c", fetch], timeout=15)
    assert (done.returncode, done.stdout.strip()) == (0, "200"), done.stderr

    # and a namespace reaches the root namespace's bridge address (where a directory listens)
    with socket.create_server((topo.root_ip, 0)) as server:
        server.settimeout(5)
        there = (topo.root_ip, server.getsockname()[1])
        reach = f"import socket; socket.create_connection({there!r}, 5)"
        done = topo.run("chengdu", [sys.executable, "-c", reach], timeout=15)
        assert done.returncode == 0, done.stderr
        peer, (peer_ip, _) = server.accept()
        peer.close()
    assert peer_ip == topo.ip("chengdu")


def test_a_delay_shows_in_round_trips(net: tuple[Topology, Proc]) -> None:
    topo, gw = net
    address = _address(gw.url)
    assert min(_connect_ms(address) for _ in range(3)) < 50  # unshaped: well under the delay

    topo.delay("beijing", 50)  # each way: a connect (one round trip) takes >= 100 ms
    assert topo.shape("beijing").delay_ms == 50
    samples = [_connect_ms(address) for _ in range(3)]
    print(f"connect with 50 ms each way: {[round(s, 1) for s in samples]} ms")
    assert all(s >= 90 for s in samples), samples
    assert statistics.median(samples) < 1000, samples
    # a GET on a new connection: the connect and the request, two round trips
    get = _get_ms(f"{gw.url}/healthz")
    assert 180 <= get < 3000, get

    # between two namespaces both links count: 2 x (50 + 25) ms for a connect
    topo.delay("shanghai", 25)
    probe = (
        "import socket, time; t = time.monotonic();"
        f" socket.create_connection({address!r}, 5).close();"
        " print((time.monotonic() - t) * 1000)"
    )
    done = topo.run("shanghai", [sys.executable, "-c", probe], timeout=15)
    assert done.returncode == 0, done.stderr
    across = float(done.stdout)
    print(f"connect shanghai -> beijing, 25 + 50 ms each way: {across:.1f} ms")
    assert 135 <= across < 1500, across

    topo.clear("beijing")
    topo.clear("shanghai")
    assert min(_connect_ms(address) for _ in range(3)) < 50


def test_a_cut_times_connects_out_and_a_restore_answers(net: tuple[Topology, Proc]) -> None:
    topo, gw = net
    address = _address(gw.url)
    topo.delay("beijing", 20)
    topo.cut("beijing")
    start = time.monotonic()
    with pytest.raises(TimeoutError):  # not refused, not "no route to host": unanswered
        socket.create_connection(address, timeout=1.0).close()
    assert time.monotonic() - start >= 0.9
    assert topo.stats("beijing").dropped > 0

    topo.restore("beijing")  # the cut goes, the delay stays
    assert topo.shape("beijing").cut is None
    assert topo.shape("beijing").delay_ms == 20
    assert _connect_ms(address) >= 36
    status, body = http("GET", f"{gw.url}/healthz", timeout=5)
    assert status == 200, body


def test_a_refusing_cut_fails_connects_at_once(net: tuple[Topology, Proc]) -> None:
    topo, gw = net
    address = _address(gw.url)
    resets = topo.stats("beijing").reset
    topo.cut("beijing", refuse=True)
    start = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=5).close()
    assert time.monotonic() - start < 0.5
    assert topo.stats("beijing").reset > resets

    topo.restore("beijing")
    status, body = http("GET", f"{gw.url}/healthz", timeout=5)
    assert status == 200, body


def test_loss_drops_about_its_share(net: tuple[Topology, Proc]) -> None:
    topo, gw = net
    host, port = _address(gw.url)
    http("GET", f"{gw.url}/healthz", timeout=5)  # the neighbour entry is there: no ARP queue

    topo.loss("beijing", 100)
    with pytest.raises(TimeoutError):
        socket.create_connection((host, port), timeout=0.5).close()

    # 400 datagrams towards beijing at 50 %: about 200 lost (sd 10), plus some of the
    # port-unreachable answers (rate-limited by the kernel)
    topo.loss("beijing", 50)
    before = topo.stats("beijing")
    seen, dropped = before.forwarded + before.dropped, before.dropped
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        for _ in range(400):
            udp.sendto(b"x", (host, 9))
    wait_until(
        lambda: topo.stats("beijing").forwarded + topo.stats("beijing").dropped - seen >= 400, 5
    )
    lost = topo.stats("beijing").dropped - dropped
    print(f"lost at 50 %: {lost} of 400 datagrams (and their answers)")
    assert 140 <= lost <= 320, lost

    topo.loss("beijing", 0)
    assert _connect_ms((host, port)) < 1000


def _ours(tag: str) -> list[str]:
    """The namespaces and interfaces here that carry ``tag``."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    return [word for word in (names.stdout + links.stdout).split() if tag in word]


def _pids(netns: str) -> list[str]:
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return done.stdout.split()


def test_a_topology_leaves_nothing_behind() -> None:
    _need_netns()
    # what a crashed run would have left: a namespace and a bridge of a pid now dead
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = f"{gone.pid}a"
    subprocess.run(["ip", "netns", "add", f"arx-{stale}-old"], check=True)
    subprocess.run(["ip", "link", "add", f"arx{stale}b", "type", "bridge"], check=True)
    assert _ours(stale)

    with Topology(["one", "two"]) as topo:
        assert not _ours(stale)  # cleared on entry
        tag = topo.tag
        assert any(f"arx-{tag}-one" in w for w in _ours(tag)), _ours(tag)
        assert f"arx{tag}b" in " ".join(_ours(tag))
        tracked = topo.popen("one", ["sleep", "60"])
        # started past the topology: still killed, as whatever else runs in its namespaces
        untracked = subprocess.Popen(topo.argv("two", ["sleep", "60"]))
        wait_until(lambda: str(untracked.pid) in _pids(topo.netns("two")), 5)
    assert not _ours(tag), _ours(tag)
    assert tracked.poll() is not None
    assert untracked.wait(5) != 0

    tags: list[str] = []
    with pytest.raises(LookupError, match="inside"):
        _fail_inside(tags)
    assert tags
    assert not _ours(tags[0]), _ours(tags[0])


def _fail_inside(tags: list[str]) -> None:
    with Topology(["three"]) as failing:
        tags.append(failing.tag)
        raise LookupError("a test failing inside the topology")


# --- the loopback stand-in -------------------------------------------------------------------


@pytest.fixture(scope="module")
def loopback_gw() -> Iterator[Proc]:
    with gateway() as gw:
        yield gw


def _raw_request(port: int) -> socket.socket:
    """A connection to 127.0.0.1:``port`` with a GET /healthz sent on it."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn.sendall(REQUEST)
    return conn


def _closed(conn: socket.socket) -> bool:
    """Whether ``conn`` was closed by its peer (an end of stream or a reset)."""
    try:
        return conn.recv(100) == b""
    except ConnectionResetError:
        return True


def test_a_delay_proxy_adds_its_delay_each_way(loopback_gw: Proc) -> None:
    direct = _get_ms(f"{loopback_gw.url}/healthz")
    with DelayProxy(loopback_gw.url, delay_ms=50) as proxy:
        through = _get_ms(f"{proxy.url}/healthz")
        print(f"GET direct {direct:.1f} ms, through 50 ms each way {through:.1f} ms")
        assert 90 <= through < 3000, through
        proxy.set_delay(100)
        assert _get_ms(f"{proxy.url}/healthz") >= 190


def test_a_delay_proxy_cut_hangs_and_a_restore_resumes(loopback_gw: Proc) -> None:
    with DelayProxy(loopback_gw.url) as proxy:
        proxy.cut()
        with _raw_request(proxy.port) as held:  # accepted, then nothing comes back
            held.settimeout(1.0)
            with pytest.raises(TimeoutError):
                held.recv(100)
            proxy.restore()  # what was sent meanwhile goes through
            held.settimeout(5)
            assert held.recv(100).startswith(b"HTTP/1.1 200")

        proxy.cut(refuse=True)
        start = time.monotonic()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=5).close()
        assert time.monotonic() - start < 0.5
        proxy.restore()
        assert _get_ms(f"{proxy.url}/healthz") < 3000


def test_a_delay_proxy_caps_connections_and_closes_cleanly(loopback_gw: Proc) -> None:
    proxy = DelayProxy(loopback_gw.url, max_connections=2)
    with proxy:
        proxy.cut()  # held connections count against the cap
        first, second = _raw_request(proxy.port), _raw_request(proxy.port)
        wait_until(lambda: proxy.active == 2, 5)
        with _raw_request(proxy.port) as third:
            assert _closed(third)
        assert proxy.rejected == 1
        proxy.restore()
        assert first.recv(100).startswith(b"HTTP/1.1 200")
        first.close()
        assert second.recv(100).startswith(b"HTTP/1.1 200")
        second.close()
        wait_until(lambda: proxy.active == 0, 5)
        port = proxy.port
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    proxy.close()  # idempotent
