"""The rollout servers as GRPO uses them: healthy, serving the model, generating text."""

from __future__ import annotations

import os
from typing import Any

import pytest
from rollout_client import Server

PROMPT = "The capital of France is"


def _models(server: Server) -> list[str]:
    listing = server.get_json("/v1/models")
    assert listing.get("object") == "list", listing
    ids = [m["id"] for m in listing["data"]]
    assert ids, "the server lists no model"
    return ids


def _completion(server: Server) -> dict[str, Any]:
    model = _models(server)[0]
    out = server.post_json(
        "/v1/completions",
        {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0, "seed": 0},
    )
    assert out["model"] == model
    return out


def _check_completion(out: dict[str, Any]) -> None:
    choice = out["choices"][0]
    assert isinstance(choice["text"], str) and choice["text"].strip(), out
    assert choice["finish_reason"] in {"length", "stop"}
    usage = out["usage"]
    assert 0 < usage["completion_tokens"] <= 8
    assert usage["prompt_tokens"] > 0


@pytest.mark.rollout_vllm
class TestVLLM:
    def test_health_is_200(self, vllm_server: Server) -> None:
        status, _ = vllm_server.get("/health")
        assert status == 200

    def test_models_lists_the_served_model(self, vllm_server: Server) -> None:
        ids = _models(vllm_server)
        if expected := _expected_model():
            assert expected in ids

    def test_completion_returns_text(self, vllm_server: Server) -> None:
        _check_completion(_completion(vllm_server))

    def test_greedy_completion_is_deterministic(self, vllm_server: Server) -> None:
        # GRPO's reference rollouts rely on temperature 0 meaning one answer.
        a = _completion(vllm_server)["choices"][0]["text"]
        b = _completion(vllm_server)["choices"][0]["text"]
        assert a == b


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
        _check_completion(_completion(sglang_server))

    def test_model_info_names_the_model(self, sglang_server: Server) -> None:
        info = sglang_server.get_json("/get_model_info")
        assert isinstance(info["model_path"], str) and info["model_path"], info
        assert info["is_generation"] is True
        if model := os.environ.get("HALO_MODEL"):
            assert info["model_path"] == model


def _expected_model() -> str:
    """The name the server was started with, when this shell knows it (compose's settings)."""
    return os.environ.get("HALO_SERVED_MODEL_NAME") or os.environ.get("HALO_MODEL", "")
