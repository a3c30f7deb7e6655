"""Where a webhook may point (issue 66, finding 1): public addresses, or what the operator
allow-listed; every internal range refused, however the address is written, and a name judged
by every address it resolves to (pure logic: the resolver is given)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence

import pytest

from alerts.destinations import DestinationError, Resolver, WebhookPolicy, is_public


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "127.8.9.10", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
        "100.64.0.1", "0.0.0.0", "224.0.0.1", "239.255.255.250", "255.255.255.255", "240.0.0.1",
        "192.0.2.1", "198.18.0.1", "::1", "::", "fe80::1", "fc00::1", "fd12:3456::1", "ff02::1",
        "::ffff:127.0.0.1", "::ffff:10.0.0.1", "2002:7f00:1::", "64:ff9b::a9fe:a9fe",
        "2001:db8::1",
    ],
)  # fmt: skip
def test_internal_addresses_are_not_public(address: str) -> None:
    assert not is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["93.184.216.34", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_are(address: str) -> None:
    assert is_public(ipaddress.ip_address(address))


def _resolver(table: Mapping[str, Sequence[str]]) -> Resolver:
    def resolve(host: str, port: int) -> Sequence[str]:
        if host not in table:
            raise OSError("Name or service not known")
        return table[host]

    return resolve


NAMES = {
    "hooks.example": ["93.184.216.34"],
    "localhost": ["127.0.0.1", "::1"],
    "metadata.internal": ["169.254.169.254"],
    "sneaky.example": ["93.184.216.34", "10.0.0.5"],
    "hooks.internal": ["10.1.2.3"],
}


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/api/v2/dags",
        "http://localhost:9092/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://169.254.169.254/latest/meta-data/",
        "http://metadata.internal/",
        "https://sneaky.example/hook",  # one inside address among outside ones
        "http://10.0.0.1/",
        "http://0.0.0.0:8000/",
    ],
)
def test_a_url_that_resolves_inside_is_refused(url: str) -> None:
    with pytest.raises(DestinationError, match="is not a public address") as refused:
        WebhookPolicy().resolve(url, _resolver(NAMES))
    assert refused.value.parameter == "webhook_url"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://hooks.example/", "scheme 'ftp'"),
        ("file:///etc/passwd", "scheme 'file'"),
        ("gopher://hooks.example/", "scheme 'gopher'"),
        ("http:///path", "names no host"),
        ("https://user:pw@hooks.example/", "credentials in the URL"),
        ("https://hooks.example:99999/", "not a URL"),
        ("https://hooks.example/a\x1bb", "control characters"),
        ("https://nowhere.example/", "does not resolve"),
        ("https://hooks.example/" + "a" * 3000, "at most 2048"),
    ],
)
def test_a_url_that_cannot_be_a_webhook_says_why(url: str, reason: str) -> None:
    with pytest.raises(DestinationError, match=reason):
        WebhookPolicy().resolve(url, _resolver(NAMES))


def test_a_public_name_resolves_to_the_address_the_connection_is_pinned_to() -> None:
    target = WebhookPolicy().resolve("https://hooks.example/ctr?x=1", _resolver(NAMES))
    assert (target.scheme, target.host, target.port) == ("https", "hooks.example", 443)
    assert (target.path, target.address) == ("/ctr?x=1", "93.184.216.34")


def test_the_operator_allows_internal_hosts_and_networks() -> None:
    policy = WebhookPolicy.parse(["hooks.internal", "127.0.0.0/8", " ", "::1"])
    resolver = _resolver(NAMES)
    assert policy.resolve("http://hooks.internal/", resolver).address == "10.1.2.3"
    assert policy.resolve("http://127.0.0.1:8080/", resolver).address == "127.0.0.1"
    assert policy.resolve("http://localhost/", resolver).address == "127.0.0.1"
    with pytest.raises(DestinationError):  # 10.0.0.5 is not allowed: the host name is not listed
        policy.resolve("http://sneaky.example/", resolver)
    with pytest.raises(ValueError, match="'not a host!' is neither"):
        WebhookPolicy.parse(["not a host!"])
