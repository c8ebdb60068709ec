"""The rollout servers as GRPO uses them: healthy, serving the model, sampling groups,
scoring tokens, stopping where asked, rendering chats as the trainer does, refusing nonsense.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from rollout_client import Server

PROMPT = "What is 2 + 3?"
MESSAGES = [
    {"role": "system", "content": "You add small numbers."},
    {"role": "user", "content": "What is 2 + 3?"},
]


def _models(server: Server) -> list[str]:
    listing = server.get_json("/v1/models")
    assert listing.get("object") == "list", listing
    ids = [m["id"] for m in listing["data"]]
    assert ids, "the server lists no model"
    return ids


def _complete(server: Server, **kw: Any) -> dict[str, Any]:
    model = _models(server)[0]
    body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0, "seed": 0}
    out = server.post_json("/v1/completions", body | kw)
    assert out["model"] == model
    return out


def _chat(server: Server, **kw: Any) -> dict[str, Any]:
    model = _models(server)[0]
    body = {"model": model, "messages": MESSAGES, "max_tokens": 8, "temperature": 0.0, "seed": 0}
    out = server.post_json("/v1/chat/completions", body | kw)
    assert out["model"] == model
    return out


def _check_completion(out: dict[str, Any]) -> None:
    choice = out["choices"][0]
    assert isinstance(choice["text"], str) and choice["text"], out
    assert choice["finish_reason"] in {"length", "stop"}
    usage = out["usage"]
    assert 0 < usage["completion_tokens"] <= 8
    assert usage["prompt_tokens"] > 0


def _expected_model() -> str:
    """The name the server was started with, when this shell knows it (compose's settings)."""
    return os.environ.get("HALO_SERVED_MODEL_NAME") or os.environ.get("HALO_MODEL", "")


@pytest.mark.rollout_vllm
class TestVLLM:
    def test_health_is_200(self, vllm_server: Server) -> None:
        status, _ = vllm_server.get("/health")
        assert status == 200

    def test_models_lists_the_served_model(self, vllm_server: Server) -> None:
        ids = _models(vllm_server)
        if expected := _expected_model():
            assert expected in ids

    def test_version_is_the_pinned_release(self, vllm_server: Server) -> None:
        assert vllm_server.get_json("/version")["version"].startswith("0.26.0")

    def test_completion_returns_text(self, vllm_server: Server) -> None:
        _check_completion(_complete(vllm_server))

    def test_greedy_completion_is_deterministic(self, vllm_server: Server) -> None:
        # GRPO's reference rollouts rely on temperature 0 meaning one answer.
        a = _complete(vllm_server)["choices"][0]["text"]
        b = _complete(vllm_server)["choices"][0]["text"]
        assert a == b

    def test_completions_sample_a_group_of_n(self, vllm_server: Server) -> None:
        out = _complete(vllm_server, n=4, temperature=1.0, seed=1, max_tokens=12)
        choices = out["choices"]
        assert sorted(c["index"] for c in choices) == [0, 1, 2, 3]
        texts = [c["text"] for c in choices]
        # A group of identical samples has no advantage signal: sampling must vary them.
        assert len(set(texts)) > 1, texts
        assert out["usage"]["completion_tokens"] >= len(choices)

    def test_chat_completions_sample_a_group_of_n(self, vllm_server: Server) -> None:
        out = _chat(vllm_server, n=3, temperature=1.0, seed=2, max_tokens=12)
        choices = out["choices"]
        assert sorted(c["index"] for c in choices) == [0, 1, 2]
        for c in choices:
            assert c["message"]["role"] == "assistant"
            assert isinstance(c["message"]["content"], str)
            assert c["finish_reason"] in {"length", "stop"}

    def test_completion_logprobs_score_every_sampled_token(self, vllm_server: Server) -> None:
        out = _complete(vllm_server, logprobs=2, max_tokens=6)
        lp = out["choices"][0]["logprobs"]
        n = out["usage"]["completion_tokens"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n
        for tok, value, top in zip(
            lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True
        ):
            assert value <= 0.0 and math.isfinite(value)
            assert 1 <= len(top) <= 3 and tok in top
            # Greedy: the chosen token is the most likely one.
            assert math.isclose(value, max(top.values()), rel_tol=0, abs_tol=1e-4)

    def test_chat_logprobs_come_with_top_alternatives(self, vllm_server: Server) -> None:
        out = _chat(vllm_server, logprobs=True, top_logprobs=2, max_tokens=4)
        content = out["choices"][0]["logprobs"]["content"]
        assert len(content) == out["usage"]["completion_tokens"]
        for item in content:
            assert item["logprob"] <= 0.0
            assert len(item["top_logprobs"]) == 2

    def test_stop_string_cuts_the_completion(self, vllm_server: Server) -> None:
        free = _chat(vllm_server, max_tokens=16)["choices"][0]["message"]["content"]
        assert len(free) >= 4, f"the model said too little to cut: {free!r}"
        cut = len(free) // 2
        stop = free[cut : cut + 2]
        first = free.find(stop)
        choice = _chat(vllm_server, max_tokens=16, stop=[stop])["choices"][0]
        assert choice["message"]["content"] == free[:first], (free, stop, choice)
        assert choice["finish_reason"] == "stop"
        assert choice["stop_reason"] == stop
        # The same through the completions API, on the same rendered prompt.
        model = _models(vllm_server)[0]
        ids = vllm_server.post_json(
            "/tokenize", {"model": model, "messages": MESSAGES, "add_generation_prompt": True}
        )["tokens"]
        out = vllm_server.post_json(
            "/v1/completions",
            {"model": model, "prompt": ids, "max_tokens": 16, "temperature": 0.0, "stop": [stop]},
        )
        assert out["choices"][0]["text"] == free[:first]

    def test_chat_template_is_the_one_the_trainer_renders(
        self, vllm_server: Server, served_folder: Path
    ) -> None:
        from halo.train.data.tokenizer import load

        tok = load(str(served_folder))  # the trainer's view of what it exported
        trained = tok.encode(tok.text(MESSAGES, gen=True))
        model = _models(vllm_server)[0]
        served = vllm_server.post_json(
            "/tokenize", {"model": model, "messages": MESSAGES, "add_generation_prompt": True}
        )["tokens"]
        if served != trained:
            shown = vllm_server.post_json("/detokenize", {"model": model, "tokens": served})
            pytest.fail(f"server renders {shown['prompt']!r}, the trainer {tok.decode(trained)!r}")

    @pytest.mark.parametrize(
        ("path", "body"),
        [
            ("/v1/completions", b'{"model": "no-such-model", "prompt": "x", "max_tokens": 2}'),
            ("/v1/completions", b'{"prompt": "x", "max_tokens": -3}'),
            ("/v1/completions", b'{"prompt": "x", "max_tokens": 2'),
            ("/v1/chat/completions", b'{"messages": "not a list", "max_tokens": 2}'),
            ("/v1/completions", b'{"prompt": "x", "max_tokens": 100000}'),
        ],
        ids=["unknown-model", "negative-max-tokens", "truncated-json", "bad-messages", "too-long"],
    )
    def test_bad_request_is_a_4xx_and_the_server_lives_on(
        self, vllm_server: Server, path: str, body: bytes
    ) -> None:
        if b'"model"' not in body:
            payload = json.loads(body) if body.endswith(b"}") else None
            if payload is not None:
                body = json.dumps({"model": _models(vllm_server)[0], **payload}).encode()
        status, answer = vllm_server.post(path, body)
        assert 400 <= status < 500, (status, answer[:300])
        assert vllm_server.get("/health")[0] == 200


@pytest.mark.rollout_sglang
class TestSGLang:
    def test_health_is_200(self, sglang_server: Server) -> None:
        status, _ = sglang_server.get("/health")
        assert status == 200

    def test_models_lists_the_served_model(self, sglang_server: Server) -> None:
        ids = _models(sglang_server)
        if expected := _expected_model():
            assert expected in ids

    def test_completion_returns_text(self, sglang_server: Server) -> None:
        _check_completion(_complete(sglang_server))

    def test_model_info_names_the_model(self, sglang_server: Server) -> None:
        info = sglang_server.get_json("/get_model_info")
        assert isinstance(info["model_path"], str) and info["model_path"], info
        assert info["is_generation"] is True
        if model := os.environ.get("HALO_MODEL"):
            assert info["model_path"] == model
