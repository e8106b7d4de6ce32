"""Webhook targets: https and public addresses only, unless the operator allows a network; metadata never."""

from __future__ import annotations

import ipaddress

import pytest

from storage.errors import InvalidWebhookUrl
from storage.webhooks.targets import TargetPolicy, refusal, resolve_target

STRICT = TargetPolicy()
LOOPBACK_ALLOWED = TargetPolicy(allow_http=True, allowed_networks=(ipaddress.ip_network("127.0.0.0/8"),))


def resolving_to(*addresses: str):  # type: ignore[no-untyped-def]
    """A stand-in for DNS: every host resolves to these addresses."""
    return lambda host, port: [ipaddress.ip_address(a) for a in addresses]


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.9", "private"),
        ("192.168.1.1", "private"),
        ("fd12::1", "private"),
        ("169.254.10.10", "link-local"),
        ("fe80::1", "link-local"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("100.64.0.1", "non-public"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("::ffff:127.0.0.1", "loopback"),
        ("64:ff9b::a00:1", "private"),
    ],
)
def test_non_public_addresses_are_refused_by_default(address: str, reason: str) -> None:
    found = refusal(ipaddress.ip_address(address), STRICT)
    assert found is not None and reason in found


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "8.8.8.8"])
def test_public_addresses_are_accepted(address: str) -> None:
    assert refusal(ipaddress.ip_address(address), STRICT) is None


def test_an_allowed_network_opens_only_itself_and_never_the_metadata_service() -> None:
    everything_private = TargetPolicy(allowed_networks=(ipaddress.ip_network("169.254.0.0/16"),))
    assert refusal(ipaddress.ip_address("127.0.0.1"), LOOPBACK_ALLOWED) is None
    assert refusal(ipaddress.ip_address("10.0.0.1"), LOOPBACK_ALLOWED) is not None
    assert "metadata" in (refusal(ipaddress.ip_address("169.254.169.254"), everything_private) or "")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://example.com/hook", "https"),
        ("ftp://example.com/hook", "https"),
        ("https://user:pw@example.com/hook", "credentials"),
        ("https:///hook", "no host"),
        ("https://example.com/hook#frag", "fragment"),
        ("https://example.com/a b", "spaces"),
        ("https://example.com:99999/", "malformed"),
        ("https://example.com/" + "a" * 3000, "2048"),
    ],
)
def test_malformed_or_plain_http_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(InvalidWebhookUrl) as error:
        resolve_target(url, STRICT, resolver=resolving_to("93.184.216.34"))
    assert message in error.value.message and error.value.param == "url"


def test_a_host_with_any_private_address_is_refused() -> None:
    with pytest.raises(InvalidWebhookUrl) as error:
        resolve_target("https://hooks.example.com/x", STRICT, resolver=resolving_to("93.184.216.34", "10.0.0.5"))
    assert "10.0.0.5" in error.value.message and "BACKFILL_WEBHOOK_ALLOWED_NETWORKS" in error.value.message


def test_a_checked_target_pins_the_address_and_keeps_the_host_for_tls() -> None:
    target = resolve_target(
        "https://Hooks.Example.com:8443/in?x=1", STRICT, resolver=resolving_to("2606:2800:220:1:248:1893:25c8:1946")
    )
    assert target.pinned_url() == "https://[2606:2800:220:1:248:1893:25c8:1946]:8443/in?x=1"
    assert target.hostname == "hooks.example.com" and target.host_header == "Hooks.Example.com:8443"


def test_the_real_resolver_refuses_localhost_and_accepts_it_when_allowed() -> None:
    with pytest.raises(InvalidWebhookUrl) as error:
        resolve_target("https://localhost/hook", STRICT)
    assert "loopback" in error.value.message
    target = resolve_target("http://localhost:9/hook", LOOPBACK_ALLOWED)
    assert target.address.is_loopback and target.port == 9 and target.path == "/hook"


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("2002:a9fe:a9fe::", "metadata"),  # 6to4 around 169.254.169.254
        ("2002:a9fe:a0a::1", "link-local"),  # 6to4 around 169.254.10.10
        ("2002:a00:1::", "private"),  # 10.0.0.1
        ("2002:c0a8:101::", "private"),  # 192.168.1.1
        ("2002:7f00:1::", "loopback"),  # 127.0.0.1
        ("2002:6440:1::", "non-public"),  # 100.64.0.1 (CGNAT)
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "private"),  # Teredo: never a public target
        ("2001:0:a9fe:a9fe::5f01:5601", "metadata"),  # Teredo with 169.254.169.254 as its server
        ("::127.0.0.1", "loopback"),  # IPv4-compatible (deprecated) form
        ("::ffff:169.254.169.254", "metadata"),
    ],
)
def test_ipv4_inside_ipv6_is_judged_as_the_ipv4_it_carries(address: str, reason: str) -> None:
    found = refusal(ipaddress.ip_address(address), STRICT)
    assert found is not None and reason in found


def test_6to4_around_a_public_address_is_accepted() -> None:
    assert refusal(ipaddress.ip_address("2002:808:808::1"), STRICT) is None  # 8.8.8.8


def test_a_6to4_metadata_host_is_refused_at_registration() -> None:
    with pytest.raises(InvalidWebhookUrl) as error:
        resolve_target("https://[2002:a9fe:a9fe::]/", STRICT)
    assert "metadata" in error.value.message


@pytest.mark.parametrize("url", ["https://8.8.8.8:0/", "https://hooks.example.com:0/x", "https://[2606:4700::1]:0/"])
def test_port_zero_is_refused(url: str) -> None:
    with pytest.raises(InvalidWebhookUrl) as error:
        resolve_target(url, STRICT, resolver=resolving_to("93.184.216.34"))
    assert "port" in error.value.message and error.value.param == "url"


@pytest.mark.parametrize(
    ("address", "kind"),
    [("169.254.169.254", "cloud metadata"), ("169.254.10.10", "link-local"), ("fe80::1", "link-local")],
)
def test_the_refusal_of_a_link_local_or_metadata_target_does_not_offer_a_setting_that_cannot_open_it(
    address: str, kind: str
) -> None:
    everything = TargetPolicy(
        allowed_networks=(ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
    )
    for policy in (STRICT, everything):  # allowing the network does not open it: the message must not say it would
        with pytest.raises(InvalidWebhookUrl) as error:
            resolve_target("https://hooks.example.com/x", policy, resolver=resolving_to(address))
        message = error.value.message
        assert kind in message and "never" in message, message
        assert "unless the operator allows" not in message, message


def test_the_refusal_of_a_private_target_names_the_setting_that_opens_it() -> None:
    with pytest.raises(InvalidWebhookUrl) as error:
        resolve_target("https://hooks.example.com/x", STRICT, resolver=resolving_to("10.0.0.5"))
    assert "BACKFILL_WEBHOOK_ALLOWED_NETWORKS" in error.value.message
    opened = TargetPolicy(allowed_networks=(ipaddress.ip_network("10.0.0.0/8"),))
    assert resolve_target("https://hooks.example.com/x", opened, resolver=resolving_to("10.0.0.5")).port == 443
