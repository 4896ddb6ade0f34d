"""Which addresses the gateway may deliver to: an allow list minus a deny list, pure.

Invariants:
- Denied wins over allowed: an address in a denied network is refused whatever is allowed.
- By default (:data:`DEFAULT_DENIED`) the gateway never delivers to this-network, link-local
  (169.254.169.254 cloud metadata included), multicast, broadcast, unspecified or known cloud
  metadata addresses, nor to the metadata host names in :data:`DENIED_HOSTS`.
- An IPv6 address that carries an IPv4 one (mapped ``::ffff:a.b.c.d``, SIIT
  ``::ffff:0:a.b.c.d``, IPv4-compatible ``::a.b.c.d``, NAT64 ``64:ff9b::/96`` and the local-use
  ``64:ff9b:1::/48``, 6to4 ``2002::/16``) is judged as the IPv4 address it reaches (and refused
  too when its IPv6 form is denied); an IPv6 zone id (``%eth0``) is ignored.
- A host written as a legacy numeric IPv4 form that resolvers accept (``2852039166``,
  ``0xa9.0xfe.0xa9.0xfe``, ``169.254.43518``) is judged as that address, not as a name.
- :meth:`AddressGuard.refusal_for_host` only checks what the name itself says: callers must
  still check every address a name resolves to with :meth:`AddressGuard.refusal_for_address`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

__all__ = ["DEFAULT_DENIED", "DENIED_HOSTS", "AddressGuard", "is_ip", "legacy_ipv4"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_WHY_DENIED = {
    "0.0.0.0/8": "this-network addresses",
    "169.254.0.0/16": "link-local and cloud metadata",
    "fe80::/10": "IPv6 link-local",
    "224.0.0.0/4": "multicast",
    "ff00::/8": "IPv6 multicast",
    "255.255.255.255/32": "broadcast",
    "100.100.100.200/32": "Alibaba Cloud metadata",
    "fd00:ec2::254/128": "AWS instance metadata over IPv6",
    "fd00:ec2::23/128": "the AWS EKS Pod Identity agent over IPv6",
    "fd20:ce::254/128": "Google Cloud metadata over IPv6",
    "168.63.129.16/32": "Azure's WireServer (platform and metadata endpoints)",
    "192.0.0.192/32": "Oracle Cloud metadata (Classic)",
    "::/128": "the unspecified address",
}
DEFAULT_DENIED: tuple[str, ...] = tuple(_WHY_DENIED)
"""Networks refused by default whatever is allowed."""

DENIED_HOSTS: frozenset[str] = frozenset({"metadata.google.internal", "metadata.goog", "metadata"})
"""Host names refused by name (compared case-insensitively, without a trailing dot)."""

DEFAULT_ALLOWED: tuple[str, ...] = ("0.0.0.0/0", "::/0")

_LEGACY_PART = re.compile(r"0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*")


def _strip(host: str) -> str:
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.split("%", 1)[0]


def _parse_ip(address: str) -> IPAddress:
    """The address ``address`` names (brackets and zone id dropped); ValueError if not an IP."""
    try:
        return ipaddress.ip_address(_strip(address))
    except ValueError:
        raise ValueError(f"{address!r} is not an IP address") from None


def is_ip(host: str) -> bool:
    """True when ``host`` is an IPv4 or IPv6 address (brackets and a zone id allowed)."""
    try:
        _parse_ip(host)
    except ValueError:
        return False
    return True


def _legacy_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The address ``inet_aton`` would read from ``host`` (octal, hex, 1-4 parts), if any."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(_LEGACY_PART.fullmatch(p) for p in parts):
        return None
    values = [_int(p) for p in parts]
    *head, last = values
    if any(v > 0xFF for v in head) or last >= 1 << (8 * (5 - len(values))):
        return None
    number = last
    for i, v in enumerate(head):
        number |= v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def legacy_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a host in a legacy numeric form names (``127.1``, ``2130706433``,
    ``017700000001``, ``0x7f.1``: what ``inet_aton`` reads), or None for a dotted quad, an
    IPv6 address or a name. Such hosts are refused at registration: the HTTP client does not
    dial them as addresses."""
    if is_ip(host):
        return None
    return _legacy_ipv4(host.strip().rstrip(".").lower())


def _int(part: str) -> int:
    if part[:2].lower() == "0x":
        return int(part[2:] or "0", 16)  # a bare "0x" reads as 0, as inet_aton does
    if len(part) > 1 and part[0] == "0":
        return int(part, 8)
    return int(part)


def _networks(cidrs: Sequence[str], what: str) -> tuple[IPNetwork, ...]:
    out: list[IPNetwork] = []
    for cidr in cidrs:
        try:
            out.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{what} network {cidr!r} is not a CIDR or an IP address") from None
    return tuple(out)


# IPv6 prefixes whose last 32 bits an IPv4 address rides in, where a network may take a packet
# to that IPv4 address: RFC 6052's well-known NAT64 prefix, SIIT's IPv4-translated addresses
# (RFC 2765, ``::ffff:0:a.b.c.d``), and the deprecated IPv4-compatible ones (``::a.b.c.d``)
_LAST_32 = (
    ipaddress.IPv6Network("64:ff9b::/96"),
    ipaddress.IPv6Network("::ffff:0:0:0/96"),
    ipaddress.IPv6Network("::/96"),
)
# RFC 8215's local-use NAT64 prefix: a network picks a prefix of 48, 56, 64 or 96 bits inside
# it, and RFC 6052 places the IPv4 address differently for each (bits 64-71 skipped)
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")
# the forms a network translates to the IPv4 address they carry (IPv4-mapped, SIIT, NAT64):
# dialled, the packet goes to that IPv4 address. The others (IPv4-compatible, 6to4, Teredo)
# are dialled as the IPv6 address they are, and must be allowed as such too
_TRANSLATED = (
    ipaddress.IPv6Network("::ffff:0:0/96"),
    ipaddress.IPv6Network("::ffff:0:0:0/96"),
    ipaddress.IPv6Network("64:ff9b::/96"),
    _LOCAL_NAT64,
)


def _bits(value: int, start: int, n: int) -> int:
    """``n`` bits of a 128-bit ``value`` from bit ``start`` (0: the most significant)."""
    return (value >> (128 - start - n)) & ((1 << n) - 1)


def _rfc6052(value: int) -> list[int]:
    """The IPv4 addresses an address of a local-use NAT64 prefix may carry (RFC 6052, section
    2.2): those of the /48, /56 and /64 layouts its bits allow (bits 64-71 zero, and every bit
    after the IPv4 address's: the likelier readings, first), then its /96 reading."""
    out = []
    if _bits(value, 64, 8) == 0:
        if _bits(value, 88, 40) == 0:
            out.append(_bits(value, 48, 16) << 16 | _bits(value, 72, 16))
        if _bits(value, 96, 32) == 0:
            out.append(_bits(value, 56, 8) << 24 | _bits(value, 72, 24))
        if _bits(value, 104, 24) == 0:
            out.append(_bits(value, 72, 32))
    out.append(_bits(value, 96, 32))
    return out


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries, where a network may deliver it to that
    IPv4 address, the likeliest first: IPv4-mapped (``::ffff:a.b.c.d``), NAT64
    (``64:ff9b::a.b.c.d``; in the local-use ``64:ff9b:1::/48`` every RFC 6052 layout), SIIT
    (``::ffff:0:a.b.c.d``), IPv4-compatible (``::a.b.c.d``), 6to4 (``2002:AABB:CCDD::``),
    Teredo (``2001::/32``: its client's address). Judged as those IPv4 addresses, so that
    169.254.169.254 is refused in any dress."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    value = int(ip)
    if ip in _LOCAL_NAT64:
        return [ipaddress.IPv4Address(v) for v in _rfc6052(value)]
    if value > 1 and any(ip in net for net in _LAST_32):  # (:: and ::1 are themselves)
        return [ipaddress.IPv4Address(value & 0xFFFFFFFF)]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return [ip.teredo[1]]
    return []


def _label(shown: str, form: IPAddress) -> str:
    """``shown`` as a refusal names it: with the address it was judged as, when another."""
    return shown if str(form) == shown else f"{shown} ({form})"


class AddressGuard:
    """Decides whether the gateway may deliver to an address or host.

    ``allowed`` and ``denied`` are CIDRs or single addresses (``ValueError`` naming a bad one);
    an address must be in some allowed network and in no denied one.
    """

    __slots__ = ("allowed", "denied")

    def __init__(
        self,
        allowed: Sequence[str] = DEFAULT_ALLOWED,
        denied: Sequence[str] = DEFAULT_DENIED,
    ) -> None:
        self.allowed = _networks(allowed, "allowed")
        self.denied = _networks(denied, "denied")

    @classmethod
    def from_csv(cls, allowed_csv: str | None) -> AddressGuard:
        """A guard allowing the comma-separated CIDRs/addresses (None or empty: the default)."""
        items = [item.strip() for item in (allowed_csv or "").split(",") if item.strip()]
        return cls(items) if items else cls()

    def __repr__(self) -> str:
        return f"AddressGuard({self.describe()})"

    def describe(self) -> str:
        """Short text of the allowed and denied networks, for a log line."""
        allowed = ", ".join(map(str, self.allowed)) or "nothing"
        denied = ", ".join(map(str, self.denied)) or "nothing"
        return f"allowed {allowed}; denied {denied}"

    def refusal_for_address(self, address: str) -> str | None:
        """None when the gateway may deliver to ``address``, else the reason as a sentence.

        ``ValueError`` when ``address`` is not an IP address.
        """
        return self._refusal(address, _parse_ip(address))

    def refusal_for_host(self, host: str) -> str | None:
        """Like :meth:`refusal_for_address` for an IP; for a name, the :data:`DENIED_HOSTS` check.

        A name's resolved addresses must still be checked by the caller.
        """
        if is_ip(host):
            return self.refusal_for_address(host)
        name = host.strip().rstrip(".").lower()
        if name in DENIED_HOSTS:
            return f"{host} is a cloud metadata host name, which this gateway never delivers to"
        legacy = _legacy_ipv4(name)
        if legacy is not None:
            return self._refusal(host, legacy)
        return None

    def _refusal(self, shown: str, ip: IPAddress) -> str | None:
        # an IPv6 address that carries IPv4 ones is judged as each of them (every one allowed,
        # none denied) and as itself (not denied; allowed too, unless a network translates it
        # to the IPv4 address: 6to4 or Teredo in an allowed IPv4 network is still an IPv6 host)
        embedded: list[IPAddress] = []
        if isinstance(ip, ipaddress.IPv6Address):
            embedded.extend(_embedded_ipv4(ip))
        for form in [*embedded, ip]:
            for net in self.denied:
                if form in net:
                    why = _WHY_DENIED.get(str(net))
                    return f"{_label(shown, form)} is in {net}, which this gateway never" + (
                        f" delivers to ({why})" if why else " delivers to"
                    )
        judged = embedded
        if not embedded or not any(ip in net for net in _TRANSLATED):
            judged = [*embedded, ip]
        for form in judged:
            if not any(form in net for net in self.allowed):
                allowed = ", ".join(map(str, self.allowed)) or "(none)"
                return f"{_label(shown, form)} is outside the allowed networks {allowed}"
        return None
