"""The OpenAI-compatible client online GRPO talks to a rollout server with (standard library).

Every failure is a `RolloutError` whose message is one line, and says whether trying again can
help: the server down or restarting (connection refused or reset, HTTP 502/503/504), a
timeout, a 5xx are transient; a 4xx (our request is wrong) and an answer that is not the
OpenAI shape (a different server, a broken proxy) are not. `Retry` runs a call again after a
backoff, at most ``attempts`` times, with one line per failure.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from halo.errors import HaloError
from halo.urls import join_path, redact_url, request, split_userinfo

T = TypeVar("T")
# Requests in flight at once when sampling a batch: enough to keep a server's batch full.
MAX_REQUESTS = 64


class RolloutError(HaloError):
    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class Sample:
    """One completion: the ids the server sampled (trained on as they are) and its text."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: str


@dataclass(frozen=True)
class Client:
    """``url`` is the server's base URL as configured. It may carry credentials: a user part
    (sent as an Authorization header, never as part of the host name) or a query (an API
    gateway's ``?api_key=…``, sent on every request). Lines show ``shown``, never ``url``."""

    url: str = field(repr=False)
    model: str
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        split_userinfo(self.url)  # a URL that cannot be parsed is one line here, not mid-run
        # The paths below carry /v1 themselves: a URL given with the OpenAI suffix (as OpenAI
        # clients take it) is the same server as without.
        object.__setattr__(self, "url", server_root(self.url))

    @property
    def shown(self) -> str:
        """The URL as logs, errors and records may show it (halo.urls.redact_url)."""
        return redact_url(self.url).rstrip("/")

    def call(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        req = request(
            join_path(self.url, path),
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        where = f"{method} {self.shown}{path}"
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:200].decode(errors="replace").replace("\n", " ")
            raise RolloutError(f"{where}: HTTP {exc.code}: {detail}", exc.code >= 500) from None
        except TimeoutError:
            raise RolloutError(f"{where}: no answer within {self.timeout_s:.0f} s", True) from None
        except (urllib.error.URLError, ConnectionError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise RolloutError(f"{where}: server unreachable ({reason})", True) from None
        if not body:
            return None
        try:
            return json.loads(body)
        except ValueError:
            raise RolloutError(f"{where}: answer is not JSON: {body[:120]!r}", False) from None

    def complete(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        max_tokens: int | Sequence[int],
        temperature: float,
        seed: int,
        stop: Sequence[str] = (),
    ) -> list[list[Sample]]:
        """``n`` samples for each prompt (given as token ids, so the server sees exactly the
        trainer's rendering), grouped per prompt in order; ``max_tokens`` for all of them or
        one per prompt.

        One request per prompt, each with its own seed, sent together (the server batches
        them): vLLM gives every prompt of one request the same seed, so sample k of each
        prompt would draw the same random numbers, and the groups of a batch would choose
        alike instead of independently.
        """

        budgets = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)

        def one(i: int) -> list[Sample]:
            out = self.call(
                "POST",
                "/v1/completions",
                {
                    "model": self.model,
                    "prompt": list(prompts[i]),
                    "n": n,
                    "max_tokens": budgets[i],
                    "temperature": temperature,
                    "seed": prompt_seed(seed, i),
                    "stop": list(stop),
                    "return_token_ids": True,
                    "skip_special_tokens": False,
                },
            )
            return parse_completions(out, 1, n, f"POST {self.shown}/v1/completions")[0]

        if not prompts:
            return []
        with ThreadPoolExecutor(min(len(prompts), MAX_REQUESTS)) as pool:
            return list(pool.map(one, range(len(prompts))))

    def prompt_logprobs(self, ids: Sequence[int]) -> list[float]:
        """log p(ids[t] | ids[:t]) for t >= 1 under the served weights: the model's fingerprint."""
        out = self.call(
            "POST",
            "/v1/completions",
            {
                "model": self.model,
                "prompt": list(ids),
                "max_tokens": 1,
                "temperature": 0.0,
                "prompt_logprobs": 0,
            },
        )
        where = f"POST {self.shown}/v1/completions (prompt_logprobs)"
        try:
            rows = out["choices"][0]["prompt_logprobs"]
            values = []
            for tok, row in zip(ids[1:], rows[1:], strict=True):
                values.append(float(row[str(tok)]["logprob"]))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise RolloutError(f"{where}: unexpected answer ({exc!r})", False) from None
        return values


def server_root(url: str) -> str:
    """The server's URL without a trailing ``/v1`` (or ``/``), its query kept."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path.rstrip("/")
    path = path.removesuffix("/v1").rstrip("/")
    return urllib.parse.urlunsplit(parts._replace(path=path))


def prompt_seed(seed: int, index: int) -> int:
    """The seed of prompt ``index`` of a batch sampled with ``seed`` (31 bits, as servers take)."""
    digest = hashlib.sha256(f"{seed}/{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def parse_completions(out: Any, prompts: int, n: int, where: str) -> list[list[Sample]]:
    try:
        choices = out["choices"]
        if len(choices) != prompts * n:
            raise ValueError(f"{len(choices)} choices for {prompts} prompts x n={n}")
        groups: list[list[Sample]] = [[] for _ in range(prompts)]
        # vLLM numbers choices across the batch: prompt i's k-th sample has index i*n + k.
        for c in sorted(choices, key=lambda c: int(c["index"])):
            ids = c["token_ids"]
            if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
                raise ValueError("token_ids is not a list of ints")
            groups[int(c["index"]) // n].append(
                Sample(tuple(ids), str(c["text"]), str(c["finish_reason"]))
            )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise RolloutError(f"{where}: malformed answer ({exc})", False) from None
    if any(len(g) != n for g in groups):
        raise RolloutError(f"{where}: malformed answer (groups are not all of size {n})", False)
    return groups


@dataclass(frozen=True)
class Retry:
    """Run a call again while its failures are transient: ``attempts`` tries in all."""

    attempts: int = 2
    backoff_s: float = 5.0
    say: Callable[[str], None] = print

    def __call__(self, what: str, fn: Callable[[], T]) -> T:
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except RolloutError as exc:
                if not exc.transient or attempt == self.attempts:
                    raise RolloutError(
                        f"{what}: {exc.message} (attempt {attempt}/{self.attempts}; giving up)",
                        exc.transient,
                    ) from None
                wait = self.backoff_s * 2 ** (attempt - 1)
                self.say(
                    f"{what}: {exc.message}; retrying in {wait:.0f} s "
                    f"(attempt {attempt}/{self.attempts})"
                )
                time.sleep(wait)
        raise AssertionError("unreachable")
