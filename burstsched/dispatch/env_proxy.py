"""The HTTP proxy the environment names for an endpoint (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``).

Read once per endpoint, when the upstream client first talks to it (aiohttp's own ``trust_env`` would read
the environment again, in a thread, for every request). ``NO_PROXY`` is matched the way Python's
``urllib`` matches it: host names and domain suffixes, ``*`` for every host; the port is ignored.
"""

from __future__ import annotations

import base64
import urllib.request
from dataclasses import dataclass
from urllib.parse import unquote

from yarl import URL


@dataclass(frozen=True, slots=True)
class EnvProxy:
    """A proxy to send requests through, and the headers it wants (its credentials, when it has any)."""

    url: URL
    headers: dict[str, str] | None = None


def env_proxy(url: URL) -> EnvProxy | None:
    """The proxy the environment names for ``url``'s scheme, unless ``NO_PROXY`` exempts its host."""
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(url.scheme)
    if not proxy or url.host is None or urllib.request.proxy_bypass(url.host):
        return None
    parsed = URL(proxy if "://" in proxy else f"http://{proxy}")
    if parsed.user is None:
        return EnvProxy(parsed)
    credentials = f"{unquote(parsed.user)}:{unquote(parsed.password or '')}".encode()
    header = "Basic " + base64.b64encode(credentials).decode("ascii")
    return EnvProxy(parsed.with_user(None), {"Proxy-Authorization": header})
