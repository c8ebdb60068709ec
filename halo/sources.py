"""Where artifacts may come from. Configuration only: nothing here names a host.

Indexes: $HALO_INDEX_URL, else the index pip/uv are configured with
($PIP_INDEX_URL, $UV_DEFAULT_INDEX, $UV_INDEX_URL), else pip's own built-in default.
Extra indexes: $HALO_EXTRA_INDEX_URLS (space separated).
Substitutes (local wheel folders, trusted only through the hash): $HALO_SUBSTITUTES
(os.pathsep separated), plus local folders named as find-links by pip's configuration
($PIP_FIND_LINKS, pip.conf files) or uv's ($UV_FIND_LINKS).
"""

from __future__ import annotations

import configparser
import os
import urllib.parse
from pathlib import Path

from halo.errors import HaloError

INDEX_VARS = ("HALO_INDEX_URL", "PIP_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL")
FIND_LINKS_VARS = ("PIP_FIND_LINKS", "UV_FIND_LINKS")


def _pip_default_index() -> str:
    # The default that pip itself ships with; asking pip keeps its location out of this repo.
    try:
        from pip._internal.models.index import PyPI
    except ImportError:
        raise HaloError(
            "no package index configured and pip is not installed: set HALO_INDEX_URL"
        ) from None
    return PyPI.simple_url


def _index_url(var: str, url: str) -> str:
    """An index URL as it is used: refused in one line (credentials redacted) if it cannot be.

    Credentials go in its user part (``https://user:TOKEN@host/simple/``): fetch sends them as
    an Authorization header, uv gets them through its own per-index variables. A query or
    fragment cannot be: a project's page is the URL joined with its name, which drops both.
    """
    from halo.urls import redact_url, split_userinfo

    try:
        bare, _ = split_userinfo(url)
    except HaloError as exc:
        raise HaloError(f"${var}: {exc.message}") from None
    parts = urllib.parse.urlsplit(bare)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HaloError(f"${var}: {redact_url(url)!r}: expected an http(s) URL of a package index")
    if parts.query or parts.fragment:
        raise HaloError(
            f"${var}: {redact_url(url)!r}: an index URL has no query or fragment; "
            "put a token in its user part (https://user:TOKEN@host/simple/)"
        )
    return url.rstrip("/") + "/"


def index_urls(env: dict[str, str] | None = None) -> list[str]:
    """The configured indexes, each as given (credentials included: show them redacted)."""
    env = dict(os.environ if env is None else env)
    primary = next(((v, env[v]) for v in INDEX_VARS if env.get(v)), None)
    urls = [primary or ("", _pip_default_index())]
    urls += [("HALO_EXTRA_INDEX_URLS", u) for u in env.get("HALO_EXTRA_INDEX_URLS", "").split()]
    return [_index_url(var or "index", u) for var, u in urls if not u.startswith("file:")]


def _pip_config_files(env: dict[str, str]) -> list[Path]:
    """pip's configuration files, in pip's own order of precedence (lowest first)."""
    if env.get("PIP_CONFIG_FILE") == os.devnull:
        return []  # pip's own rule: PIP_CONFIG_FILE=/dev/null turns every config file off
    xdg_dirs = env.get("XDG_CONFIG_DIRS", "/etc/xdg").split(os.pathsep)
    home = Path(env.get("HOME", str(Path.home())))
    files = [Path(d) / "pip" / "pip.conf" for d in xdg_dirs] + [Path("/etc/pip.conf")]
    files += [
        home / ".pip" / "pip.conf",
        Path(env.get("XDG_CONFIG_HOME", str(home / ".config"))) / "pip" / "pip.conf",
    ]
    if cfg := env.get("PIP_CONFIG_FILE"):
        files.append(Path(cfg))
    return files


def _pip_config_find_links(env: dict[str, str]) -> str:
    links: list[str] = []
    for path in _pip_config_files(env):
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(path)
        except (configparser.Error, OSError):
            continue
        for section in ("global", "download", "install"):
            if parser.has_option(section, "find-links"):
                links.append(parser.get(section, "find-links"))
    return " ".join(links)


def substitute_dirs(env: dict[str, str] | None = None) -> list[Path]:
    env = dict(os.environ if env is None else env)
    dirs: list[str] = [d for d in env.get("HALO_SUBSTITUTES", "").split(os.pathsep) if d]
    configured = [env.get(var, "") for var in FIND_LINKS_VARS] + [_pip_config_find_links(env)]
    for value in configured:
        for entry in value.replace(",", " ").split():
            if entry.startswith("file://"):
                entry = entry.removeprefix("file://")
            if "://" not in entry:
                dirs.append(entry)
    seen: list[Path] = []
    for d in dirs:
        p = Path(d)
        if p.is_dir() and p not in seen:
            seen.append(p)
    return seen


# -- Debian ---------------------------------------------------------------------------------

APT_SOURCES = Path("/etc/apt")


def _apt_sources(root: Path) -> list[tuple[str, list[str], list[str]]]:
    """(URI, suites, components) of every `deb` source in the host's apt configuration."""
    out: list[tuple[str, list[str], list[str]]] = []
    lists = [root / "sources.list", *sorted((root / "sources.list.d").glob("*.list"))]
    for path in lists:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            words = line.split("#", 1)[0].split()
            if words[:1] != ["deb"]:
                continue
            words = words[1:]
            if words and words[0].startswith("["):  # options: [arch=amd64 signed-by=…]
                while words and not words[0].endswith("]"):
                    words.pop(0)
                words = words[1:]
            if len(words) >= 2:
                out.append((words[0], [words[1]], words[2:]))
    for path in sorted((root / "sources.list.d").glob("*.sources")):
        try:
            text = path.read_text()
        except OSError:
            continue
        for stanza in text.split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line:
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if "deb" not in fields.get("types", "").split() or fields.get("enabled") == "no":
                continue
            for uri in fields.get("uris", "").split():
                out.append(
                    (uri, fields.get("suites", "").split(), fields.get("components", "").split())
                )
    return out


def debian_mirror(suite: str, env: dict[str, str] | None = None, apt: Path = APT_SOURCES) -> str:
    """The Debian mirror .debs and indexes come from: $HALO_DEBIAN_MIRROR, else the first of the
    host's apt sources that serves ``suite``'s main component. Only a substitute: every .deb is
    kept by its locked sha256, so which mirror serves it does not matter."""
    env = dict(os.environ if env is None else env)
    if env.get("HALO_DEBIAN_MIRROR"):
        return env["HALO_DEBIAN_MIRROR"].rstrip("/")
    for uri, suites, components in _apt_sources(apt):
        if suite in suites and "main" in components and uri.startswith(("http://", "https://")):
            return uri.rstrip("/")
    raise HaloError(
        f"no Debian mirror for {suite}: set HALO_DEBIAN_MIRROR (none of {apt}'s apt sources serves {suite} main)"
    )
