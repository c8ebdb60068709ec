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


# --- secrets in echoed lines and records ---------------------------------------------------------
#
# What Halo echoes (the command `halo launch` runs, a dry run's config, a Slurm script, a job
# record, a tracker's config) shows a value as HIDDEN when its key names a secret, and a URL
# without its userinfo and with the values of secret-looking query keys hidden. Unlike
# redact_url, what stays is still the same command: every other key, path and query is kept.

HIDDEN = "***"
# A key names a secret when one of its words is one of these (AWS_SECRET_ACCESS_KEY,
# db_password, X-Amz-Credential) ...
_SECRET_ANYWHERE = frozenset(
    "secret secrets password passwd credential credentials apikey authorization".split()  # noqa: SIM905
)
# ... or its last word is one of these (HF_TOKEN, api_key, apiKey, X-Amz-Signature; not
# num_key_value_heads) ...
_SECRET_LAST = frozenset(["key", "token", "pwd", "auth", "signature", "sig"])
# ... unless its last word says it is about the secret, not the secret (pad_token_id,
# api_key_path, AWS_SHARED_CREDENTIALS_FILE, AWS_ACCESS_KEY_ID: an identifier, not a secret).
_NOT_SECRET_LAST = frozenset(
    ["id", "ids", "len", "length", "count", "size", "limit", "type", "path", "file", "dir"]
)


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def is_secret_name(name: str) -> bool:
    """Whether a key (an environment variable, a config key, a query parameter) names a secret."""
    words = _words(name)
    if not words or words[-1] in _NOT_SECRET_LAST:
        return False
    return words[-1] in _SECRET_LAST or not _SECRET_ANYWHERE.isdisjoint(words)


def hide_url_secrets(url: str) -> str:
    """``url`` without its userinfo (as redact_url) and with secret-looking query values
    hidden: ``https://u:t@h/p?api_key=k&n=1`` -> ``https://h/p?api_key=***&n=1``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return redact_url(url) or "<URL>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = netloc.rpartition("@")[2]
    query = "&".join(
        f"{k}={HIDDEN}" if is_secret_name(urllib.parse.unquote_plus(k)) and sep else k + sep + v
        for k, sep, v in (q.partition("=") for q in parts.query.split("&") if q)
    )
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))


def hide_secrets_in_text(text: str) -> str:
    """``text`` with every URL in it passed through hide_url_secrets."""
    return _URL_IN_TEXT.sub(lambda m: hide_url_secrets(m.group(0)), text)


def hide_secrets(value: object, name: str = "") -> object:
    """A copy of ``value`` (mappings, lists, strings, as a config or record holds them) with
    the value of every key that names a secret hidden, and the URLs in strings too."""
    if name and is_secret_name(name) and value not in (None, ""):
        return HIDDEN
    if isinstance(value, dict):
        return {k: hide_secrets(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [hide_secrets(v) for v in value]
    if isinstance(value, str):
        return hide_secrets_in_text(value)
    return value


def hide_override(arg: str) -> str:
    """One ``--KEY=VALUE`` override (or any command-line word) as it may be shown."""
    if arg.startswith("--") and "=" in arg:
        key, _, value = arg.partition("=")
        last = key[2:].rsplit(".", 1)[-1]
        if is_secret_name(last) and value:
            return f"{key}={HIDDEN}"
        if value[:1] in "{[":
            # A mapping or list given whole (--runtime.env={"HF_TOKEN": ...}): its keys count.
            import json

            try:
                parsed = json.loads(value)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict | list):
                return f"{key}={json.dumps(hide_secrets(parsed, last))}"
        return f"{key}={hide_secrets_in_text(value)}"
    return hide_secrets_in_text(arg)


def hide_argv(argv: list[str]) -> list[str]:
    """A command's words as they may be echoed (shlex.join the result to print it)."""
    return [hide_override(a) for a in argv]


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
