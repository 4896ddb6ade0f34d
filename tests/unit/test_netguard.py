"""Unit tests of agent_reach.core.netguard: metadata and link-local refused by default,
IPv4-mapped and zone-id forms, allow-list narrowing, denied over allowed, host names."""

from __future__ import annotations

import ipaddress
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_reach.core.netguard import DEFAULT_DENIED, DENIED_HOSTS, AddressGuard, is_ip

DEFAULT = AddressGuard()


def test_default_lists() -> None:
    assert set(DEFAULT_DENIED) == {
        "0.0.0.0/8",
        "169.254.0.0/16",
        "fe80::/10",
        "224.0.0.0/4",
        "ff00::/8",
        "255.255.255.255/32",
        "100.100.100.200/32",
        "fd00:ec2::254/128",
        "fd00:ec2::23/128",
        "fd20:ce::254/128",
        "168.63.129.16/32",
        "192.0.0.192/32",
        "::/128",
    }
    assert {"metadata.google.internal", "metadata.goog", "metadata"} == DENIED_HOSTS


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        (
            "169.254.169.254",
            "169.254.169.254 is in 169.254.0.0/16, which this gateway never delivers to "
            "(link-local and cloud metadata)",
        ),
        (
            "::ffff:169.254.169.254",
            "::ffff:169.254.169.254 (169.254.169.254) is in 169.254.0.0/16, which this gateway "
            "never delivers to (link-local and cloud metadata)",
        ),
        ("::ffff:a9fe:a9fe", "(169.254.169.254) is in 169.254.0.0/16"),
        ("fe80::1%eth0", "fe80::1%eth0 (fe80::1) is in fe80::/10"),
        ("[fe80::1%25eth0]", "is in fe80::/10"),
        ("fe80::1", "(IPv6 link-local)"),
        ("100.100.100.200", "(Alibaba Cloud metadata)"),
        ("fd00:ec2::254", "(AWS instance metadata over IPv6)"),
        # added after a review: known credential and metadata endpoints that passed
        ("fd00:ec2::23", "(the AWS EKS Pod Identity agent over IPv6)"),
        ("fd20:ce::254", "(Google Cloud metadata over IPv6)"),
        ("168.63.129.16", "(Azure's WireServer (platform and metadata endpoints))"),
        ("192.0.0.192", "(Oracle Cloud metadata (Classic))"),
        ("0.0.0.0", "(this-network addresses)"),
        ("0.1.2.3", "is in 0.0.0.0/8"),
        ("::", "(the unspecified address)"),
        ("224.0.0.1", "(multicast)"),
        ("239.255.255.250", "(multicast)"),
        ("ff02::1", "(IPv6 multicast)"),
        ("255.255.255.255", "(broadcast)"),
        ("::ffff:0.0.0.0", "is in 0.0.0.0/8"),
    ],
)
def test_refused_by_default(address: str, reason: str) -> None:
    refusal = DEFAULT.refusal_for_address(address)
    assert refusal is not None
    assert reason in refusal
    assert DEFAULT.refusal_for_host(address) == refusal


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "192.168.1.10",
        "8.8.8.8",
        "::1",
        "2001:db8::1",
        "::ffff:10.0.0.1",
        "169.253.255.255",
        "169.255.0.0",
        "100.100.100.201",
        "fd00:ec2::253",
        "255.255.255.254",
        "[::1]",
    ],
)
def test_allowed_by_default(address: str) -> None:
    assert DEFAULT.refusal_for_address(address) is None


@pytest.mark.parametrize("address", ["", "localhost", "1.2.3", "10.0.0.256", "::g", "1.2.3.4/32"])
def test_not_an_ip_is_a_value_error(address: str) -> None:
    with pytest.raises(ValueError, match="not an IP address"):
        DEFAULT.refusal_for_address(address)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("fe80::1%eth0", True),
        ("[::1]", True),
        ("localhost", False),
        ("example.com", False),
        ("2852039166", False),  # a legacy numeric form, not a canonical address
        ("", False),
    ],
)
def test_is_ip(host: str, expected: bool) -> None:
    assert is_ip(host) is expected


# --- allow list ---------------------------------------------------------------------------------


def test_allowed_list_narrows() -> None:
    guard = AddressGuard(["127.0.0.0/8"])
    assert guard.refusal_for_address("127.0.0.1") is None
    assert guard.refusal_for_address("127.9.9.9") is None
    assert guard.refusal_for_address("10.1.2.3") == (
        "10.1.2.3 is outside the allowed networks 127.0.0.0/8"
    )
    assert guard.refusal_for_address("::1") is not None  # IPv6 not allowed
    assert guard.refusal_for_address("::ffff:127.0.0.1") is None  # judged as 127.0.0.1


def test_denied_wins_over_allowed() -> None:
    guard = AddressGuard(["169.254.0.0/16", "10.0.0.0/8"])
    refusal = guard.refusal_for_address("169.254.169.254")
    assert refusal is not None
    assert "never delivers to" in refusal
    assert guard.refusal_for_address("10.0.0.1") is None


def test_custom_denied_list() -> None:
    guard = AddressGuard(denied=["10.0.0.0/8", "::ffff:0:0/96"])
    assert guard.refusal_for_address("10.1.1.1") == (
        "10.1.1.1 is in 10.0.0.0/8, which this gateway never delivers to"
    )
    # the custom list replaces the default one
    assert guard.refusal_for_address("169.254.169.254") is None
    # denied in its IPv6 form: refused although the IPv4 form is fine
    assert guard.refusal_for_address("::ffff:8.8.8.8") is not None
    assert guard.refusal_for_address("8.8.8.8") is None


def test_nothing_allowed() -> None:
    guard = AddressGuard([])
    assert guard.refusal_for_address("8.8.8.8") == (
        "8.8.8.8 is outside the allowed networks (none)"
    )


@pytest.mark.parametrize(
    ("allowed", "denied", "bad"),
    [
        (["10.0.0.0/33"], DEFAULT_DENIED, "'10.0.0.0/33'"),
        (["nope"], DEFAULT_DENIED, "allowed network 'nope'"),
        (["10.0.0.0/8"], ["fe80::/129"], "denied network 'fe80::/129'"),
        ([""], DEFAULT_DENIED, "''"),
    ],
)
def test_bad_cidr_is_named(allowed: list[str], denied: list[str], bad: str) -> None:
    with pytest.raises(ValueError, match=re.escape(bad)):
        AddressGuard(allowed, denied)


def test_host_bits_and_single_addresses_are_accepted() -> None:
    guard = AddressGuard(["10.0.0.1/8", "192.168.1.5", "::1"])
    assert [str(n) for n in guard.allowed] == ["10.0.0.0/8", "192.168.1.5/32", "::1/128"]
    assert guard.refusal_for_address("192.168.1.5") is None
    assert guard.refusal_for_address("192.168.1.6") is not None


@pytest.mark.parametrize(
    ("csv", "allowed"),
    [
        (None, ["0.0.0.0/0", "::/0"]),
        ("", ["0.0.0.0/0", "::/0"]),
        (" , ", ["0.0.0.0/0", "::/0"]),
        ("127.0.0.0/8", ["127.0.0.0/8"]),
        (" 10.0.0.0/8 ,127.0.0.1,, ::1 ", ["10.0.0.0/8", "127.0.0.1/32", "::1/128"]),
    ],
)
def test_from_csv(csv: str | None, allowed: list[str]) -> None:
    guard = AddressGuard.from_csv(csv)
    assert [str(n) for n in guard.allowed] == allowed
    assert [str(n) for n in guard.denied] == list(DEFAULT_DENIED)


def test_from_csv_bad_item() -> None:
    with pytest.raises(ValueError, match=re.escape("'10.0.0.0/99'")):
        AddressGuard.from_csv("127.0.0.1, 10.0.0.0/99")


def test_describe() -> None:
    text = AddressGuard.from_csv("127.0.0.0/8").describe()
    assert text.startswith("allowed 127.0.0.0/8; denied 0.0.0.0/8, 169.254.0.0/16")
    assert "\n" not in text
    assert AddressGuard([], []).describe() == "allowed nothing; denied nothing"
    assert "127.0.0.0/8" in repr(AddressGuard.from_csv("127.0.0.0/8"))


# --- host names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "refused"),
    [
        ("metadata.google.internal", True),
        ("METADATA.Google.Internal", True),
        ("metadata.google.internal.", True),
        ("metadata.goog", True),
        ("metadata", True),
        ("metadata.", True),
        ("metadata.example.com", False),
        ("my-metadata", False),
        ("weather.internal", False),
        ("localhost", False),
        ("example.com", False),
        ("cafe.be", False),  # hex letters, but a name
        ("169.254.169.254", True),
        ("[fe80::1%eth0]", True),
        ("127.0.0.1", False),
        # legacy numeric IPv4 forms resolvers accept, judged as the address they name
        ("2852039166", True),  # 169.254.169.254 as one number
        ("0xa9fea9fe", True),
        ("0xA9.0xFE.0xA9.0xFE", True),
        ("0251.0376.0251.0376", True),  # octal
        ("169.254.43518", True),
        ("169.16689662", True),
        ("0", True),  # 0.0.0.0
        ("2130706433", False),  # 127.0.0.1
        ("4294967296", False),  # too big for inet_aton: a name
        ("1.2.3.256", False),  # not valid in any form
        ("256.1.1.1", False),
        ("169.16777216", False),  # the last part overflows its 3 bytes
        ("169.16777215", False),  # 169.255.255.255
        ("169.254.65535", True),  # 169.254.255.255
        ("09.1.1.1", False),  # 09 is not octal: a name
    ],
)
def test_refusal_for_host(host: str, refused: bool) -> None:
    assert (DEFAULT.refusal_for_host(host) is not None) is refused


def test_host_name_reason() -> None:
    assert DEFAULT.refusal_for_host("Metadata.Google.Internal.") == (
        "Metadata.Google.Internal. is a cloud metadata host name, which this gateway never "
        "delivers to"
    )
    assert DEFAULT.refusal_for_host("2852039166") == (
        "2852039166 (169.254.169.254) is in 169.254.0.0/16, which this gateway never delivers "
        "to (link-local and cloud metadata)"
    )


def test_names_are_not_checked_against_the_allow_list() -> None:
    guard = AddressGuard(["127.0.0.0/8"])
    assert guard.refusal_for_host("example.com") is None  # its addresses are the caller's job
    assert guard.refusal_for_host("10.0.0.1") is not None
    assert guard.refusal_for_host("2130706433") is None  # 127.0.0.1


@settings(max_examples=300, deadline=None)
@given(number=st.integers(0, 2**32 - 1))
def test_ipv4_mapped_is_judged_like_ipv4(number: int) -> None:
    v4 = ipaddress.IPv4Address(number)
    mapped = f"::ffff:{v4}"
    for guard in (DEFAULT, AddressGuard(["10.0.0.0/8", "192.168.0.0/16"])):
        assert (guard.refusal_for_address(str(v4)) is None) == (
            guard.refusal_for_address(mapped) is None
        )


@settings(max_examples=300, deadline=None)
@given(number=st.integers(0, 2**32 - 1))
def test_legacy_single_number_is_judged_like_the_address(number: int) -> None:
    guard = AddressGuard(["10.0.0.0/8"])
    v4 = str(ipaddress.IPv4Address(number))
    assert (guard.refusal_for_host(str(number)) is None) == (guard.refusal_for_host(v4) is None)
    assert (guard.refusal_for_host(hex(number)) is None) == (guard.refusal_for_host(v4) is None)


@settings(max_examples=300, deadline=None)
@given(
    denied=st.sampled_from(DEFAULT_DENIED),
    offset=st.integers(0, 2**128 - 1),
    allowed=st.sampled_from([("0.0.0.0/0", "::/0"), ("169.254.0.0/16", "fe80::/10"), ()]),
    mapped=st.booleans(),
)
def test_denied_always_wins(
    denied: str, offset: int, allowed: tuple[str, ...], mapped: bool
) -> None:
    net = ipaddress.ip_network(denied)
    ip = net[offset % net.num_addresses]
    address = f"::ffff:{ip}" if mapped and ip.version == 4 else str(ip)
    refusal = AddressGuard(allowed).refusal_for_address(address)
    assert refusal is not None
    assert f"is in {denied}, which this gateway never delivers to (" in refusal


@pytest.mark.parametrize(
    "address",
    ["64:ff9b::a9fe:a9fe", "64:ff9b::169.254.169.254", "2002:a9fe:a9fe::1", "2002:a9fe:a9fe:1::5"],
)
def test_ipv4_carried_in_nat64_and_6to4_addresses_is_judged_as_ipv4(address: str) -> None:
    refusal = AddressGuard().refusal_for_address(address)
    assert refusal is not None and "169.254.169.254" in refusal and "169.254.0.0/16" in refusal


def test_nat64_of_an_allowed_ipv4_is_allowed() -> None:
    guard = AddressGuard(allowed=["10.0.0.0/8"])
    assert guard.refusal_for_address("64:ff9b::a00:1") is None  # 10.0.0.1
    assert guard.refusal_for_address("64:ff9b::b00:1") is not None  # 11.0.0.1


@pytest.mark.parametrize(
    "address",
    [
        "::ffff:0:a9fe:a9fe",  # SIIT (RFC 2765): an IPv4-translated address
        "64:ff9b:1::a9fe:a9fe",  # the local-use NAT64 prefix (RFC 8215)
        "64:ff9b:1:abcd::a9fe:a9fe",
        "::a9fe:a9fe",  # IPv4-compatible (deprecated, still routed by some stacks)
        "::169.254.169.254",
        # the local-use prefix's other RFC 6052 layouts (a review found the /64 one let in)
        "64:ff9b:1:ffff:a9:fea9:fe00:0",  # /64: bits 72-103
        "64:ff9b:1:ffa9:fe:a9fe::",  # /56: bits 56-63, then 72-95
        "64:ff9b:1:a9fe:a9:fe00::",  # /48: bits 48-63, then 72-87
        # Teredo (RFC 4380): the client's address, its bits inverted, in the last 32
        "2001:0:4136:e378:8000:63bf:5601:5601",
    ],
)
def test_the_metadata_address_is_refused_in_every_ipv6_dress(address: str) -> None:
    refusal = AddressGuard().refusal_for_address(address)
    assert refusal is not None and "169.254.0.0/16" in refusal, refusal
    assert "(169.254.169.254)" in refusal


def test_a_local_use_nat64_address_is_read_only_in_the_layouts_its_bits_allow() -> None:
    """The /96 layout (every local-use deployment we know): its IPv4 address alone, not the
    0.0.0.0 its bits would read as in the /64 layout (bits 104-127 are not zero there)."""
    guard = AddressGuard(allowed=["10.0.0.0/8"])
    assert guard.refusal_for_address("64:ff9b:1::a00:1") is None  # 10.0.0.1
    # a /64-layout 10.0.0.1: read as 1.0.0.0 in the /96 one too; each reading must be allowed
    refusal = guard.refusal_for_address("64:ff9b:1:0:a:0:100:0")
    assert refusal is not None and "(1.0.0.0) is outside the allowed networks" in refusal


def test_the_ipv6_loopback_and_unspecified_are_themselves() -> None:
    guard = AddressGuard()
    assert guard.refusal_for_address("::1") is None  # not 0.0.0.1
    assert "the unspecified address" in (guard.refusal_for_address("::") or "")
    assert guard.refusal_for_address("::ffff:0:808:808") is None  # 8.8.8.8, allowed


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("::ffff:10.0.0.1", True),  # mapped: dialled as 10.0.0.1
        ("::ffff:0:a00:1", True),  # SIIT
        ("64:ff9b::a00:1", True),  # NAT64
        ("2002:a00:1:dead:beef::1", False),  # 6to4 carrying 10.0.0.1: an IPv6 host
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", False),  # Teredo, any server
        ("::a00:1", False),  # IPv4-compatible, dialled as IPv6
    ],
)
def test_a_narrowed_allow_list_judges_6to4_teredo_and_compatible_as_ipv6_hosts(
    address: str, allowed: bool
) -> None:
    """A review: with --endpoint-networks 10.0.0.0/8 these passed, judged only by the IPv4
    address inside them, though the client dials the IPv6 address itself: a way out of the
    narrowed networks. Forms a network translates to IPv4 are still judged as IPv4."""
    guard = AddressGuard.from_csv("10.0.0.0/8")
    refusal = guard.refusal_for_address(address)
    assert (refusal is None) is allowed, refusal
    both = AddressGuard.from_csv(f"10.0.0.0/8,{address}/128")
    assert both.refusal_for_address(address) is None  # allowed as itself too: fine
