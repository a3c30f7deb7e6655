"""Where a webhook may point: a public address, or one the operator allow-listed.

A rule's ``webhook_url`` is a tenant's text, and the evaluator sends signed requests to it from
inside the platform's network. Left unchecked it reaches what only the platform can reach (the
Airflow API, the broker, a cloud's metadata service at 169.254.169.254) and reads back how each
answered: a port scanner. So a destination is checked twice, by the same rule: when the rule is
created, and at each delivery after DNS resolution, where the connection goes to the address
that was checked (:func:`resolve`: pinned, so a name that resolves to a public address at the
check and to 127.0.0.1 a moment later reaches neither). An address is allowed when it is
public (not loopback, private, link-local, multicast, shared, reserved or unspecified, IPv4
inside IPv6 included), or inside ``ALERTS_WEBHOOK_ALLOW`` (CIDRs), or its host name is listed
there (exactly, any case): how an operator lets rules reach an internal receiver."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import SplitResult, urlsplit

from alerts.rules import RuleError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# (host, port) -> every address the name resolves to; socket.getaddrinfo by default.
Resolver = Callable[[str, int], Sequence[str]]
SCHEMES: Final = {"http": 80, "https": 443}
MAX_URL: Final = 2048
_LABEL: Final = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST_NAME: Final = re.compile(rf"{_LABEL}(\.{_LABEL})*")


class DestinationError(RuleError):
    """A webhook URL the platform will not send to; the message says why (never what the
    destination answered: the rule's owner reads it)."""

    def __init__(self, message: str) -> None:
        super().__init__("webhook_url", message)


class UnresolvedError(DestinationError):
    """The URL's host name does not resolve (now): nothing is known of where it points."""


@dataclass(frozen=True)
class Target:
    """A checked destination: the URL's parts and the address the connection goes to."""

    scheme: str
    host: str  # as the URL names it: the Host header and, for https, the certificate's name
    port: int
    path: str  # path and query, as sent
    address: str  # the checked IP address the connection is pinned to


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (the system's resolver)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def is_public(address: Address) -> bool:
    """Whether ``address`` is on the public internet: none of the ranges a request from inside
    the platform must not reach (an IPv4 address carried in IPv6 is judged as IPv4)."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour or _teredo_client(address)
        if inner is not None:
            return is_public(inner)
        if address in _NAT64:  # 64:ff9b::/96 carries an IPv4 address in its last 32 bits
            return is_public(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return address.is_global and not (
        address.is_multicast
        or address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_reserved
        or address.is_unspecified
    )


_NAT64: Final = ipaddress.IPv6Network("64:ff9b::/96")


def _teredo_client(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    teredo = address.teredo
    return teredo[1] if teredo is not None else None


@dataclass(frozen=True)
class WebhookPolicy:
    """The destinations webhooks may reach: public addresses, and the operator's ``networks``
    and ``hosts`` besides."""

    networks: tuple[Network, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> WebhookPolicy:
        """A policy of host names and CIDRs (a bare address is its own /32 or /128);
        ValueError naming an entry that is neither."""
        networks: list[Network] = []
        hosts: set[str] = set()
        for raw in entries:
            entry = raw.strip()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            name = entry.lower().rstrip(".")
            if not _HOST_NAME.fullmatch(name):
                raise ValueError(f"{entry!r} is neither a host name nor an address or CIDR")
            hosts.add(name)
        return cls(tuple(networks), frozenset(hosts))

    def allows(self, host: str, address: Address) -> bool:
        if host.lower().rstrip(".") in self.hosts:
            return True
        if any(address in network for network in self.networks):
            return True
        return is_public(address)

    def check_url(self, url: str) -> SplitResult:
        """The URL's parts if it can be a webhook at all (http or https, a host, no
        credentials, no fragment); :class:`DestinationError` saying what is wrong."""
        if len(url) > MAX_URL:
            raise DestinationError(f"at most {MAX_URL} characters")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise DestinationError(f"not a URL ({exc})") from None
        if parts.scheme not in SCHEMES:
            raise DestinationError(f"an http(s) URL, got scheme {parts.scheme!r}")
        if not parts.hostname:
            raise DestinationError("the URL names no host")
        if parts.username is not None or parts.password is not None:
            raise DestinationError(
                "credentials in the URL are not sent; the request is signed (X-Ctr-Signature)"
            )
        if port == 0:
            raise DestinationError("port 0")
        if any(ord(c) < 33 or ord(c) == 127 for c in url):
            raise DestinationError("spaces and control characters are not allowed in the URL")
        return parts

    def resolve(self, url: str, resolver: Resolver = system_resolver) -> Target:
        """The URL checked and its host resolved: every address it resolves to must be allowed
        (one that is not refuses the URL: a name cannot smuggle an inside address among
        outside ones); the connection goes to the first."""
        parts = self.check_url(url)
        host = parts.hostname or ""
        port = parts.port or SCHEMES[parts.scheme]
        try:
            literal: Address | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            addresses: list[Address] = [literal]
        else:
            try:
                found = resolver(host, port)
            except (OSError, UnicodeError):
                found = []
            addresses = [a for a in (_address(text) for text in found) if a is not None]
            if not addresses:
                raise UnresolvedError(f"the host {host!r} does not resolve")
        for address in addresses:
            if not self.allows(host, address):
                raise DestinationError(
                    f"the host {host!r} is not a public address (loopback, private, "
                    "link-local and other internal addresses are refused unless the operator "
                    "allows them: ALERTS_WEBHOOK_ALLOW)"
                )
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return Target(parts.scheme, host, port, path, str(addresses[0]))


def _address(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])  # no IPv6 zone index
    except ValueError:
        return None
