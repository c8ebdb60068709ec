"""URLs that may carry a credential: sent as a header, shown only redacted.

``http://user:TOKEN@host/simple/`` is how indexes and proxies take credentials. The userinfo
is never part of a host name: :func:`request` sends it as an ``Authorization: Basic`` header
(kept off redirects, so it never reaches another host) and requests the URL without it.
Everything that reaches a log, an error line or a record goes through :func:`redact_url`,
the one redaction: no userinfo, no query, no fragment.
"""

from __future__ import annotations

import base64
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from halo.errors import HaloError


def redact_url(url: str) -> str:
    """``url`` without userinfo, query or fragment: what may reach a label, a record or a log.

    ``https://user:token@host/org/repo.git?x#y`` → ``https://host/org/repo.git``; the scp-like
    ``git@host:org/repo.git`` → ``ssh://host/org/repo.git``; anything unparseable → ``""``.
    """
    url = url.strip()
    scp = re.match(r"^[^/@:]+@([^/:]+):(?!//)(.+)$", url)
    if scp:
        return f"ssh://{scp.group(1)}/{scp.group(2).lstrip('/')}"
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return ""
    if not parts.scheme or not parts.hostname:
        return "" if "@" in url else url.split("?", 1)[0].split("#", 1)[0]
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"{host}:{port}" if port else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")


def redact_text(text: str) -> str:
    """``text`` (a command line, a message) with every URL in it redacted."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)) or "<URL>", text)


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    @property
    def basic(self) -> str:
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return f"Basic {token}"


def split_userinfo(url: str) -> tuple[str, Credentials | None]:
    """(``url`` without its userinfo, the credentials it held or None); the rest is kept."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (a bad port raises here, not later in a host lookup)
    except ValueError:
        raise HaloError(f"{redact_url(url) or '<URL>'}: not a valid URL") from None
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    creds = Credentials(urllib.parse.unquote(user), urllib.parse.unquote(password))
    return urllib.parse.urlunsplit(parts._replace(netloc=hostport)), creds


def join_path(base: str, path: str) -> str:
    """``path`` (``/v1/models``, ``/info?x=1``) below the base URL ``base``, keeping the base's
    query (an API gateway's key) after it: ``http://h/api?k=1`` + ``/health`` →
    ``http://h/api/health?k=1``."""
    parts = urllib.parse.urlsplit(base)
    path, _, query = path.partition("?")
    joined = "&".join(q for q in (parts.query, query) if q)
    return urllib.parse.urlunsplit(
        parts._replace(path=parts.path.rstrip("/") + path, query=joined, fragment="")
    )


def request(
    url: str,
    data: bytes | None = None,
    method: str | None = None,
    headers: dict[str, str] | None = None,
) -> urllib.request.Request:
    """A request for ``url`` whose userinfo travels as an Authorization header, never as
    part of the host name, and only to this host (an unredirected header)."""
    bare, creds = split_userinfo(url)
    req = urllib.request.Request(bare, data=data, method=method, headers=headers or {})
    if creds is not None and "Authorization" not in (headers or {}):
        req.add_unredirected_header("Authorization", creds.basic)
    return req
