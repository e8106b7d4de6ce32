"""Where a webhook may go: an https URL whose host resolves only to public addresses. The same rules decide which
image and document URLs of batch lines the worker fetches (worker/engine/media.py, its own policy and setting).

Checked when an endpoint is registered and again before every attempt (DNS can change in between), and
the attempt then connects to the very address that was checked, so a second lookup cannot rebind it.
The operator may allow non-public networks (`BACKFILL_WEBHOOK_ALLOWED_NETWORKS`, e.g. a receiver on the
same host); link-local and cloud metadata addresses are refused whatever the setting says (clouds serve
credentials on link-local addresses beyond the well-known metadata ones). An IPv6 address that carries an
IPv4 one (mapped, compatible, NAT64, 6to4, Teredo) is judged by the IPv4 address it carries.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from storage.errors import InvalidWebhookUrl
from storage.settings import Settings

URL_MAX_CHARS = 2048

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Instance metadata services (AWS, GCP and Azure; the ECS task endpoint; AWS over IPv6; Alibaba).
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200")
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")

Resolver = Callable[[str, int], list[IPAddress]]


@dataclass(frozen=True)
class TargetPolicy:
    """What the operator allows: plain http, and non-public networks a target may resolve to; and the words a
    refusal uses (what the URL is for, the rule, the setting that opens a network)."""

    allow_http: bool = False
    allowed_networks: tuple[IPNetwork, ...] = ()
    noun: str = "webhook"
    rule: str = "webhooks go only to public addresses"
    networks_setting: str = "BACKFILL_WEBHOOK_ALLOWED_NETWORKS"

    @classmethod
    def from_settings(cls, settings: Settings) -> TargetPolicy:
        networks = tuple(ipaddress.ip_network(n, strict=False) for n in settings.webhook_allowed_networks)
        return cls(allow_http=settings.webhook_allow_http, allowed_networks=networks)


@dataclass(frozen=True)
class Target:
    """A checked target: connect to `address`, send `host_header`, verify TLS against `hostname`."""

    scheme: str
    hostname: str
    port: int
    path: str  # path and query, as sent on the request line
    host_header: str
    address: IPAddress

    def pinned_url(self) -> str:
        """The URL with the checked address in place of the host name."""
        host = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        return f"{self.scheme}://{host}:{self.port}{self.path}"


def _system_resolver(host: str, port: int) -> list[IPAddress]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise LookupError(str(error)) from None
    # Drop an IPv6 scope ("fe80::1%eth0"): the address itself decides.
    return list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))


def refusal(address: IPAddress, policy: TargetPolicy) -> str | None:
    """Why `address` may not receive webhooks (None: it may)."""
    found = _refusal(address, policy)
    return None if found is None else found[0]


def _refusal(address: IPAddress, policy: TargetPolicy) -> tuple[str, bool] | None:
    """Why `address` is refused and whether `BACKFILL_WEBHOOK_ALLOWED_NETWORKS` could open it."""
    embedded = _embedded_ipv4(address)
    for inner in embedded:
        found = _refusal(inner, policy)
        if found is not None:
            return found
    if (
        embedded and isinstance(address, ipaddress.IPv6Address) and address.teredo is None
    ):  # the IPv6 form only wraps a public IPv4 address: judged as that
        return None
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address", False
    if address.is_link_local:
        return "a link-local address", False
    if any(address in network for network in policy.allowed_networks):
        return None
    for kind, flag in (
        ("a loopback", address.is_loopback),
        ("an unspecified", address.is_unspecified),
        ("a multicast", address.is_multicast),
        ("a private", address.is_private),
        ("a reserved", address.is_reserved),
        ("a non-public", not address.is_global),
    ):
        if flag:
            return f"{kind} address", True
    return None


def _embedded_ipv4(address: IPAddress) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (a Teredo address carries its server's and its client's)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    if address.sixtofour is not None:
        return [address.sixtofour]
    if address.teredo is not None:
        return list(address.teredo)
    if address in _NAT64 or (address in _IPV4_COMPATIBLE and int(address) > 1):  # not "::" nor "::1"
        return [ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)]
    return []


def check_url(url: Any, policy: TargetPolicy) -> tuple[str, str, int, str, str]:
    """Check the URL's form; return (scheme, hostname, port, path, host header) or raise InvalidWebhookUrl."""
    if not isinstance(url, str) or not url or len(url) > URL_MAX_CHARS:
        raise InvalidWebhookUrl(
            f"The {policy.noun} url must be a URL of at most {URL_MAX_CHARS} characters.", param="url"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise InvalidWebhookUrl(f"The {policy.noun} url is malformed: {error}.", param="url") from None
    schemes = ("https", "http") if policy.allow_http else ("https",)
    if parts.scheme not in schemes:
        why = " or http" if policy.allow_http else " (plain http is off on this server)"
        raise InvalidWebhookUrl(f"The {policy.noun} url must use https{why}.", param="url")
    if not parts.hostname:
        raise InvalidWebhookUrl(f"The {policy.noun} url has no host.", param="url")
    if parts.username is not None or parts.password is not None:
        raise InvalidWebhookUrl(f"The {policy.noun} url must not carry credentials.", param="url")
    if parts.fragment:
        raise InvalidWebhookUrl(f"The {policy.noun} url must not have a #fragment.", param="url")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise InvalidWebhookUrl(f"The {policy.noun} url must not contain spaces or control characters.", param="url")
    if port is not None and not 1 <= port <= 65535:
        raise InvalidWebhookUrl(f"The {policy.noun} url's port must be between 1 and 65535, not {port}.", param="url")
    default_port = 443 if parts.scheme == "https" else 80
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host_header = parts.netloc.rpartition("@")[2]
    return parts.scheme, parts.hostname, default_port if port is None else port, path, host_header


def resolve_target(url: str, policy: TargetPolicy, *, resolver: Resolver = _system_resolver) -> Target:
    """Check `url` and every address its host resolves to; raise InvalidWebhookUrl naming the refusal."""
    scheme, hostname, port, path, host_header = check_url(url, policy)
    try:
        addresses = resolver(hostname, port)
    except LookupError as error:
        raise InvalidWebhookUrl(
            f"The {policy.noun} host '{hostname}' does not resolve ({error}).", param="url"
        ) from None
    if not addresses:
        raise InvalidWebhookUrl(f"The {policy.noun} host '{hostname}' does not resolve.", param="url")
    for address in addresses:
        found = _refusal(address, policy)
        if found is not None:
            reason, can_allow = found
            rule = (
                f"{policy.rule} unless the operator allows the network ({policy.networks_setting})"
                if can_allow
                else "link-local and cloud metadata addresses are never allowed, whatever "
                f"{policy.networks_setting} says"
            )
            raise InvalidWebhookUrl(
                f"The {policy.noun} host '{hostname}' resolves to {reason} ({address}); {rule}.", param="url"
            )
    return Target(scheme, hostname, port, path, host_header, addresses[0])
