"""The Host header check: a server answers only requests addressed to one of its own names.

Without an API key the service answers anyone who can reach it, which on a developer's machine
is meant to be the machine itself. A web page can still reach it through DNS rebinding: its
own name (``attacker.example``) made to resolve to 127.0.0.1, the browser then sends that page's
requests to the service, with ``Host: attacker.example:8000``, and lets the page read the answers
(same origin, as far as the browser knows). Refusing every Host that is not a name of this server
stops that, as Django's ``ALLOWED_HOSTS`` and Starlette's ``TrustedHostMiddleware`` do.

`AllowedHosts.from_settings` decides what passes:

- ``BART_OPT_ALLOWED_HOSTS`` set: exactly those (comma-separated names or addresses, ``*.example.com``
  for the subdomains of one, ``*`` for any), with or without an API key;
- unset, no API key: the server's own names: loopback (``localhost``, ``*.localhost``, 127.0.0.0/8,
  ``::1``), the address it listens on (``BART_OPT_HOST``), the address the connection arrived on,
  and, when it listens on every interface (``0.0.0.0``, ``::``), any IP address (a port mapping
  or NAT puts other addresses in front of it; an address cannot be rebound to another server);
- unset, with an API key: any Host (a rebinding page has no key: it is another origin than the
  dashboard's, which keeps the key in its tab's ``sessionStorage``).

The port is not part of the check (a tunnel or a port mapping changes it). A request without a
Host header passes (a browser always sends one; HTTP/1.1 requires it, and uvicorn refuses an HTTP/1.1
request without it). A refused request is 400 ``host_not_allowed`` and reaches no route.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import error_response

ANY = "*"
_LOOPBACK_NAMES = ("localhost",)
_WILDCARD_ADDRESSES = ("0.0.0.0", "::", "")


def parse_hosts(value: str) -> tuple[str, ...]:
    """The entries of ``BART_OPT_ALLOWED_HOSTS``: comma-separated, lower-cased, blanks dropped.
    Raises ValueError for an entry that holds a port, a path or white space inside."""
    entries = []
    for part in value.split(","):
        entry = part.strip().lower().rstrip(".")
        if not entry:
            continue
        bare = entry.removeprefix("*.") if entry != ANY else "x"
        if any(c in bare for c in "/ @\t") or (":" in bare and not _is_ip(bare.strip("[]"))):
            raise ValueError(f"BART_OPT_ALLOWED_HOSTS: {part.strip()!r} is not a host name or address (give names "
                             "without a port or path, e.g. bart.example.com,*.internal.example,10.0.0.5)")
        entries.append(entry.strip("[]"))
    return tuple(entries)


def host_name(header: str) -> str:
    """The name or address of a Host header value, without its port, brackets or final dot, lower-cased."""
    value = header.strip().lower()
    if value.startswith("["):  # [::1]:8000
        return value[1:].split("]", 1)[0]
    if value.count(":") > 1:  # a bare IPv6 address (not valid in Host, but unambiguous)
        return value
    return value.split(":", 1)[0].rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class AllowedHosts:
    """What Host values pass (see the module docstring). `entries` None: the server's own names."""

    entries: tuple[str, ...] | None
    bound: str
    any_address: bool

    @classmethod
    def from_settings(cls, allowed_hosts: str | None, api_key_set: bool, host: str) -> AllowedHosts:
        """The rule for ``BART_OPT_ALLOWED_HOSTS`` (None: unset), whether ``BART_OPT_API_KEY`` is set, and ``BART_OPT_HOST``."""
        entries = parse_hosts(allowed_hosts) if allowed_hosts is not None else ((ANY,) if api_key_set else None)
        bound = host_name(host) if host not in _WILDCARD_ADDRESSES else ""
        return cls(entries, bound, host.strip("[]") in _WILDCARD_ADDRESSES)

    def allows(self, name: str, arrived_on: str | None = None) -> bool:
        """Whether Host name `name` (`host_name`'s) passes; `arrived_on` is the local address the
        connection came in on (ASGI's ``scope["server"]``)."""
        if self.entries is not None:
            return any(entry == ANY or entry == name or (entry.startswith("*.") and name.endswith(entry[1:]))
                       for entry in self.entries)
        if not name:
            return False
        if name in _LOOPBACK_NAMES or name.endswith(".localhost") or name in (self.bound, arrived_on):
            return True
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            return False
        return address.is_loopback or self.any_address


class HostCheckMiddleware:
    """Answers 400 ``host_not_allowed`` to a request whose Host the rule refuses (see the module docstring)."""

    def __init__(self, app: ASGIApp, hosts: AllowedHosts) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get("host")
        server = scope.get("server")
        # No Host at all (HTTP/1.0 tools; uvicorn refuses an HTTP/1.1 request without one) is no browser's request,
        # so no rebinding page's: it passes. An empty one does not.
        if given is None or self.hosts.allows(host_name(given), None if not server else str(server[0])):
            await self.app(scope, receive, send)
            return
        shown = given if len(given) <= 100 else given[:100] + "..."
        message = (f"Host {shown!r} is not a name of this server; without an API key it answers only its own "
                   "names (localhost, its loopback and listening addresses): list the names clients use in "
                   "BART_OPT_ALLOWED_HOSTS")
        if self.hosts.entries is not None:
            message = f"Host {shown!r} is not among this server's BART_OPT_ALLOWED_HOSTS"
        await error_response(Request(scope), 400, "host_not_allowed", message, field="Host")(scope, receive, send)
