"""environmental-grpo on the CPU: the real tiny model writes every turn (rollout.backend:
local, the same Sampler contract as the rollout server's client), against the example's
calculator environment and environments that fail on purpose.

The starting point is the example's own (sft.yaml: the model calls the calculator about a
third of the time, otherwise guesses); GRPO raises its mean reward. The loss mask covers
exactly the tokens the model sampled, never the environment's; an environment that raises or
answers malformed steps ends only that episode (error recorded, reward 0, counted in the
metrics) and training goes on; the turn and token limits end episodes; an environment that
does not import is one line. The rollout URL works with or without /v1. The same example
against the real vLLM server: tests/rollout/test_environmental_grpo.py.
"""

from __future__ import annotations

import fcntl
import http.server
import itertools
import json
import math
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from halo.rollout.client import Client, Sample
from halo.train.checkpoints import checkpoint, export
from halo.train.methods import environment
from halo.train.methods import environmental_grpo as eg
from halo.train.methods.local_sampler import LocalSampler

from .conftest import EXAMPLES, metrics, train_here
from .test_model_config import main_here, nothing_written

pytestmark = pytest.mark.cpu

EXAMPLE = EXAMPLES / "environmental-grpo"
CONFIG = EXAMPLE / "config.yaml"
CALCULATOR = f"{EXAMPLE / 'calculator.py'}:Calculator"
FAULTY = f"{Path(__file__).parent / 'envs_for_tests.py'}:Faulty"
ENDLESS = f"{Path(__file__).parent / 'envs_for_tests.py'}:Endless"
LIMITS = environment.Limits(max_turns=3, max_tokens=128, turn_tokens=48)


@pytest.fixture(scope="session")
def start(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """The example's starting point, trained and exported as its config says: once per
    session, shared by the pytest-xdist workers (the first builds it, under a lock)."""
    base = tmp_path_factory.getbasetemp()
    worker = hasattr(request.config, "workerinput")  # under pytest-xdist
    root = base.parent if worker else base  # the session's folder, never the user's
    with (root / "env-start.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        served = root / "env-start" / "served"
        if not (served / "config.json").is_file():
            tmp = root / "env-start"
            rc, out = train_here("sft", EXAMPLE / "sft.yaml", tmp)
            assert rc == 0, out
            found = checkpoint.latest(tmp / "ck" / "tiny-env-start")
            assert found is not None
            export.export(found.path, served)
    return served


@pytest.fixture(scope="session")
def policy(start: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    from halo.train.data.tokenizer import load

    return AutoModelForCausalLM.from_pretrained(str(start)).eval(), load(str(start))


class Recording:
    """The local sampler, keeping every sample it hands out."""

    def __init__(self, inner: LocalSampler) -> None:
        self.inner, self.samples = inner, []  # type: ignore[var-annotated]

    def complete(
        self, prompts: Sequence[Sequence[int]], n: int, max_tokens: Any, temperature: float,
        seed: int,
    ) -> list[list[Sample]]:  # fmt: skip
        out = self.inner.complete(prompts, n, max_tokens, temperature, seed)
        self.samples += [s for g in out for s in g]
        return out


def rows(n: int, **extra: Any) -> list[tuple[dict[str, Any], str]]:
    lines = (EXAMPLE / "train.jsonl").read_text().splitlines()[:n]
    return [({**json.loads(x), **extra}, f"train.jsonl:{i + 1}") for i, x in enumerate(lines)]


def spans(ids: list[int], train: list[bool], want: bool) -> list[list[int]]:
    """The runs of consecutive tokens whose mask is ``want``."""
    return [
        [i for i, _ in run]
        for mask, run in itertools.groupby(zip(ids, train, strict=True), key=lambda x: x[1])
        if mask == want
    ]


def test_the_loss_mask_covers_exactly_the_models_own_tokens(policy: tuple[Any, Any]) -> None:
    model, tok = policy
    sampler = Recording(LocalSampler(model, tok))
    factory = environment.load(CALCULATOR)
    groups = environment.play(factory, {}, rows(6), 4, tok, sampler, LIMITS, 1.0, seed=3)
    episodes = [ep for g in groups for ep in g]
    multi = [ep for ep in episodes if ep.turns >= 2]
    assert multi, [tok.decode(ep.ids) for ep in episodes]  # the calculator was called
    written = {tuple(s.token_ids) for s in sampler.samples}
    for ep in episodes:
        trained = spans(ep.ids, ep.train, True)
        # Each trained span is one turn exactly as sampled; nothing else is trained on.
        assert len(trained) == ep.turns and all(tuple(s) in written for s in trained)
        assert sum(ep.train) == sum(len(s) for s in trained)
        context = tok.decode([i for i, t in zip(ep.ids, ep.train, strict=True) if not t])
        assert context.startswith("<|im_start|>user\nWhat is ")
    for ep in multi:
        text = tok.decode(ep.ids)
        assert "<|im_start|>tool\n" in text, text
        untrained = [tok.decode(s) for s in spans(ep.ids, ep.train, False)]
        # The calculator's answer and the template around it: context, never trained on.
        assert any("<|im_start|>tool\n" in u and "<|im_start|>assistant\n" in u for u in untrained)
        assert all("<|im_start|>tool" not in tok.decode(s) for s in spans(ep.ids, ep.train, True))
    # GRPO's sequences: next-token targets weighted exactly where the model wrote.
    seqs = eg.group(episodes[:4], tok.pad_id).seqs
    for ep, seq in zip(episodes[:4], seqs, strict=True):
        assert seq.input_ids == ep.ids[:-1] and seq.targets == ep.ids[1:]
        assert seq.weights == [1.0 if t else 0.0 for t in ep.train[1:]]


def test_a_failing_environment_ends_only_its_episode(policy: tuple[Any, Any]) -> None:
    model, tok = policy
    factory = environment.load(FAULTY)
    faults = ["raises", "malformed", "reward", "reset", ""]
    batch = [(r, w) for f in faults for r, w in rows(1, fault=f)]
    groups = environment.play(factory, {}, batch, 2, tok, LocalSampler(model, tok), LIMITS, 1.0, 0)
    by_fault = dict(zip(faults, groups, strict=True))
    for fault in ("raises", "malformed", "reward", "reset"):
        for ep in by_fault[fault]:
            assert ep.status == "error" and ep.reward == 0.0 and ep.error, (fault, ep)
            assert ep.error.startswith("train.jsonl:1: "), ep.error
    assert "step 1: KeyError: 'score'" in by_fault["raises"][0].error  # type: ignore[operator]
    assert "expected Step(observation, reward, done)" in by_fault["malformed"][0].error  # type: ignore[operator]
    assert "reward: expected a finite number, got 'high'" in by_fault["reward"][0].error  # type: ignore[operator]
    assert "reset: RuntimeError: the task server is down" in by_fault["reset"][0].error  # type: ignore[operator]
    assert by_fault["reset"][0].ids == [] and by_fault["raises"][0].turns == 1
    assert all(ep.status == "done" and ep.reward == 1.0 for ep in by_fault[""])
    tally = environment.Tally().add(groups).metrics()
    assert tally["env_errors"] == 8 and tally["reward"] == pytest.approx(2 / 10)


def test_the_turn_and_token_limits_end_episodes(policy: tuple[Any, Any]) -> None:
    model, tok = policy
    factory = environment.load(ENDLESS)
    sampler = LocalSampler(model, tok)
    (turns,) = environment.play(factory, {}, rows(1), 2, tok, sampler, LIMITS, 1.0, 0)
    for ep in turns:
        assert ep.status in ("turn_limit", "cut"), ep
        if ep.status == "turn_limit":
            assert ep.turns == 3 and ep.reward == pytest.approx(0.75)
    short = environment.Limits(max_turns=10, max_tokens=40, turn_tokens=48)
    (tokens,) = environment.play(factory, {}, rows(1), 2, tok, sampler, short, 1.0, 0)
    for ep in tokens:
        assert ep.status in ("token_limit", "cut") and len(ep.ids) <= 40, ep
    tiny = environment.Limits(max_turns=3, max_tokens=128, turn_tokens=2)
    (cut,) = environment.play(factory, {}, rows(1), 2, tok, sampler, tiny, 1.0, 0)
    assert all(ep.status == "cut" and sum(ep.train) == 2 for ep in cut), cut


# The example as it is, 12 steps of 4 rows x 8 episodes, sampled locally: measured, the mean
# reward goes 0.25 -> 0.88 (mean of the last three steps), the first step having about a third
# of the episodes call the calculator.
def test_the_example_trains_with_a_rising_reward(start: Path, tmp_path: Path) -> None:
    rc, out = train_here(
        "environmental-grpo", CONFIG, tmp_path, f"--model.name_or_path={start}",
        "--rollout.backend=local", "--rollout.eval_every_steps=0",
    )  # fmt: skip
    assert rc == 0, out
    steps = [r for r in metrics(tmp_path, "tiny-env-grpo") if "loss" in r]
    rewards = [r["reward"] for r in steps]
    assert len(rewards) == 12
    assert sum(rewards[-3:]) / 3 >= rewards[0] + 0.3, rewards
    assert all(r["env_errors"] == 0 for r in steps)
    assert max(r["turns"] for r in steps[-3:]) > 1.5  # multi-turn: tool call, then the answer
    assert "sampled by this process" in out


def test_training_goes_on_past_failing_environments(start: Path, tmp_path: Path) -> None:
    data = tmp_path / "faulty.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"What is {i} + 1?", "fault": f}) + "\n"
            for i, f in enumerate(["raises", "reset", "malformed", ""])
        )
    )
    rc, out = train_here(
        "environmental-grpo", CONFIG, tmp_path, f"--model.name_or_path={start}",
        "--rollout.backend=local", "--rollout.eval_every_steps=0", f"--data.train={data}",
        "--data.eval=null", f"--environment.path={FAULTY}", "--training.epochs=2",
        "--rollout.n=2", "--rollout.max_tokens=8",
    )  # fmt: skip
    assert rc == 0, out
    steps = [r for r in metrics(tmp_path, "tiny-env-grpo") if "loss" in r]
    assert [r["env_errors"] for r in steps] == [6.0, 6.0]  # 3 of 4 rows x 2 episodes, each step
    assert all(math.isfinite(r["loss"]) for r in steps)  # a failed reset's row is harmless
    assert "6 episode(s) ended by an environment error; the first: " in out, out


def test_an_environment_that_does_not_import_is_one_line(tmp_path: Path, start: Path) -> None:
    for path, expected in (
        ("no_such_module:Env", "environment.path: cannot load no_such_module:Env"),
        (f"{EXAMPLE / 'missing.py'}:Env", "missing.py: no such file"),
        (f"{EXAMPLE / 'calculator.py'}:Nope", "has no attribute 'Nope'"),
    ):
        rc, line = main_here(
            "environmental-grpo", CONFIG, tmp_path, f"--environment.path={path}",
            f"--model.name_or_path={start}", "--rollout.backend=local",
        )  # fmt: skip
        assert rc == 2 and expected in line, line
        assert nothing_written(tmp_path / "ck" / "tiny-env-grpo")
    rc, line = main_here("environmental-grpo", EXAMPLES / "sft" / "config.yaml", tmp_path)
    assert rc == 2 and "environment: environmental-grpo needs this section" in line, line


def test_tool_calls_are_read_from_the_turn() -> None:
    text = (
        'Let me check. <tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3"}}'
        '</tool_call><tool_call>{"name": "add", "arguments": null}</tool_call>'
        "<tool_call>not json</tool_call>"
    )
    assert environment.tool_calls(text) == [
        {"name": "calculator", "arguments": {"expression": "2 + 3"}},
        {"name": "add", "arguments": {}},
    ]


class Recorder(http.server.BaseHTTPRequestHandler):
    paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        Recorder.paths.append(self.path)
        body = json.dumps({"data": [{"id": "served"}]}).encode()
        self.send_response(200 if self.path.startswith("/v1/models") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def openai_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    Recorder.paths = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/", "/v1?key=k"])
def test_a_rollout_url_with_or_without_v1_is_the_same_server(
    openai_server: str, suffix: str
) -> None:
    from halo.train.methods.online_grpo import served_model

    client = Client(openai_server + suffix, "")
    assert served_model(client) == "served"
    query = "?key=k" if "?" in suffix else ""
    assert Recorder.paths == [f"/v1/models{query}"]
    assert "/v1" not in client.shown
