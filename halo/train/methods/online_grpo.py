"""Online GRPO: the policy samples its own groups from a rollout server, is scored, updated,
and pushed back to the server before the next rollout.

Per step: a global batch of prompts (the same seeded order as the offline loop) -> ``n``
completions each from the server's OpenAI API (the prompt sent as the trainer's own
rendering, token ids, so the server sees exactly what the policy is trained on) -> the reward
function named in ``rollout.reward`` scores each against its dataset row -> GRPO's policy
update on exactly the sampled tokens (group advantages, clipped surrogate, optional KL:
GRPO's loss through `loop.step`) -> the new
weights written as a serving folder and reloaded by the server in place
(halo.rollout.weights) -> the server's log-probs of a probe sequence must equal the policy's
before the next rollout starts. Held-out prompts (``data.eval``) are sampled as in training
every ``rollout.eval_every_steps``, with a fixed seed: their mean reward is the curve that
says whether it learns.

Data rows: ``{"prompt": str | messages, "completion": reference}`` (the prompt/completion
format; the reward reads the row). The server URL comes from ``runtime.rollout_url`` or
$HALO_ROLLOUT_URL.

Failures are one line each. Transient rollout errors (server down, timeout, 5xx) are retried
after a backoff (``rollout.attempts`` tries in all); a second failure, a malformed answer, a
reward that raises or a server that serves other weights than pushed stops the run with
exit 1, after an emergency checkpoint when the policy moved since the last one: the last
checkpoint is never lost.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from halo.errors import HaloError
from halo.rollout import weights
from halo.rollout.client import Client, Retry, RolloutError, Sample
from halo.train import rewards
from halo.train.config import Config, Grpo
from halo.train.data import batching, examples
from halo.train.data.tokenizer import ChatTokenizer
from halo.train.loop import loop, saving
from halo.train.loop.stopping import StopFlag
from halo.train.methods import grpo, grpo_data, online_grpo_data
from halo.train.methods.online_grpo_data import Prompt
from halo.train.models import hf
from halo.train.parallel import distributed
from halo.train.state import Method, Result, Trainer

URL_ENV = "HALO_ROLLOUT_URL"
# Scored by the server after each push and compared with the policy's own log-probs.
PROBE = [
    {"role": "user", "content": "What is 7 + 5?"},
    {"role": "assistant", "content": "7 + 5 = 12."},
]


class RunFailedError(HaloError):
    """The run cannot go on (rollout, reward or push): exit 1, the checkpoints kept."""

    exit_code = 1


def server_url(cfg: Config) -> str:
    url = cfg.runtime.rollout_url or os.environ.get(URL_ENV)
    if not url:
        raise HaloError(
            f"runtime.rollout_url: not set (nor ${URL_ENV}): online-grpo needs a server"
        )
    return url.rstrip("/")


@dataclass
class Rollouts:
    """The rollout server as the loop uses it: sample, evaluate, push, check."""

    cfg: Config
    tr: Trainer
    client: Client
    retry: Retry
    reward: rewards.Reward
    probe: list[int]
    pushed: list[Path] = field(default_factory=list)
    last_probe: list[float] | None = None

    @property
    def ro(self) -> Any:
        return self.cfg.rollout

    def prompt_ids(self, prompts: list[Prompt]) -> list[list[int]]:
        tok = self.tr.tok
        return [tok.encode(online_grpo_data.text(tok, p)) for p in prompts]

    def sample(
        self, what: str, prompts: list[Prompt], n: int, temperature: float, seed: int
    ) -> tuple[list[list[Sample]], list[list[float]]]:
        ids = self.prompt_ids(prompts)
        groups = self.retry(
            what,
            lambda: self.client.complete(ids, n, self.ro.max_tokens, temperature, seed),
        )
        texts = [[s.text for s in g] for g in groups]
        rows = [p.row for p in prompts]
        return groups, rewards.score(
            self.reward, self.ro.reward, texts, rows, [p.where for p in prompts]
        )

    def push(self) -> dict[str, float]:
        """Export the policy, have the server reload it, check it serves exactly that."""
        tr, ro = self.tr, self.ro
        root = ro.export_dir or tr.cfg.job_dir / "served"
        folder = root / f"step_{tr.step:06d}"
        saving.export_model(tr, folder)  # collective
        expected = policy_logprobs(tr, self.probe)  # collective under FSDP
        out: dict[str, float] = {}
        if tr.ctx.is_main:
            on_server = str(Path(ro.export_dir_on_server or root) / folder.name)
            t0 = time.monotonic()
            self.retry(f"push step {tr.step}", lambda: weights.reload(self.client, on_server))
            out["push_s"] = time.monotonic() - t0
            served, gap = self.retry(
                f"check step {tr.step}",
                lambda: weights.check_served(self.client, self.probe, expected, ro.check_tolerance),
            )
            if self.last_probe is not None:
                out["served_shift"] = max(
                    abs(a - b) for a, b in zip(served, self.last_probe, strict=True)
                )
            self.last_probe = served
            out["probe_gap"] = gap
            # The server reads only the newest folder; the one before may still be in use
            # by a retried reload, older ones are done with.
            self.pushed.append(folder)
            for old in self.pushed[:-2]:
                shutil.rmtree(old, ignore_errors=True)
            self.pushed = self.pushed[-2:]
        return tr.ctx.broadcast(out)

    def evaluate(self, prompts: list[Prompt]) -> float:
        if not prompts or not self.tr.ctx.is_main:
            return self.tr.ctx.broadcast(None) if prompts else float("nan")
        # The reward the policy is trained to raise: sampled as in training (n per prompt,
        # the same temperature), with a fixed seed so that only the weights change.
        ro = self.ro
        _, scores = self.sample("eval", prompts, ro.n, ro.temperature, self.cfg.training.seed)
        mean = sum(map(sum, scores)) / sum(map(len, scores))
        return self.tr.ctx.broadcast(mean)


def encode(
    prompt: list[int], group: list[Sample], scores: list[float], max_len: int
) -> grpo_data.Group:
    """A group as GRPO trains on it: the prompt and exactly the tokens the server sampled
    (ending with the end-of-turn token when it stopped), trained on the sampled tokens.

    Token ids, not the text re-rendered: a byte-level sample that is not valid UTF-8 comes
    back as U+FFFD, which re-encodes to other tokens than the ones the policy chose.
    """
    seqs = []
    for s in group:
        full = [*prompt, *s.token_ids][: max_len + 1]
        train = ([False] * len(prompt) + [True] * len(s.token_ids))[: max_len + 1]
        seqs.append(examples.shift(full, train))
    return grpo_data.Group(tuple(seqs), tuple(scores))


def policy_logprobs(tr: Trainer, ids: list[int]) -> list[float]:
    """log p(ids[t] | ids[:t]) for t >= 1 under the policy, in fp32."""
    x = torch.tensor([ids], device=tr.ctx.device)
    with torch.no_grad():
        lp = hf.token_logprobs(hf.logits(tr.model, {"input_ids": x[:, :-1]}), x[:, 1:])
    return [float(v) for v in lp[0].tolist()]


def build(cfg: Config, tok: ChatTokenizer) -> Method:
    """The GRPO update (grpo.method) over this run's prompts; rollouts come at train time."""
    g = cfg.grpo or Grpo()
    train, evals = batching.load(cfg.data, cfg.training.seed, online_grpo_data.parse)
    ro = cfg.rollout
    rewards.load(ro.reward)  # fail before any model is built
    notes = [
        f"online-grpo: {len(train)} prompts, {len(evals)} held out (their mean reward every "
        f"{ro.eval_every_steps} steps: eval_reward); n {ro.n}, "
        f"temperature {ro.temperature}, max_tokens {ro.max_tokens}, reward {ro.reward}; "
        f"clip {g.clip_eps}, kl_coef {g.kl_coef}, scale_rewards {g.scale_rewards}"
    ]
    m = grpo.method(cfg, tok, train, evals, notes)
    m.name = "online-grpo"
    return m


def train(
    cfg: Config,
    method: Method,
    tok: ChatTokenizer,
    ctx: distributed.Context,
    stop: StopFlag | None = None,
    checkpoint_hook_sleep: tuple[int, float] | None = None,
) -> Result:
    t, ro = cfg.training, cfg.rollout
    stop = stop or StopFlag()
    prompts: list[Prompt] = method.items
    held_out: list[Prompt] = method.eval_items
    tr, sched, resumed = loop.start(cfg, method, tok, ctx)
    client = Client(server_url(cfg), ro.model_name or "", ro.timeout_s)
    if not client.model and ctx.is_main:
        client = Client(client.url, served_model(client), ro.timeout_s)
    probe = tok.render(PROBE).ids
    rollouts = Rollouts(
        cfg,
        tr,
        client,
        Retry(ro.attempts, ro.backoff_s, say=lambda line: loop.log(ctx, line)),
        rewards.load(ro.reward),
        probe,
    )
    loop.log(
        ctx,
        f"online-grpo: {t.global_batch_size} prompts x {ro.n} per step, "
        f"from {client.shown} ({client.model})",
    )
    metrics = loop.open_metrics(cfg, ctx, tr, resumed)
    result = Result(tr.step, {}, 0, 0.0, False, None)
    checkpoints = loop.Checkpoints(tr, sched, result, resumed, checkpoint_hook_sleep)
    started = time.monotonic()

    def eval_row(first: bool = False) -> None:
        every = ro.eval_every_steps
        if held_out and every and (first or tr.step % every == 0 or tr.step == sched.total_steps):
            metrics.eval(tr.step, rollouts.evaluate(held_out), "eval_reward")

    try:
        try:
            rollouts.push()  # the server serves the policy before the first rollout
            eval_row(first=True)
            for step in range(tr.step, sched.total_steps):
                batch = [prompts[i] for i in sched.global_batch_of(step)]
                groups, scores = ([], [])
                if ctx.is_main:
                    groups, scores = rollouts.sample(
                        f"rollout step {step + 1}",
                        batch,
                        ro.n,
                        ro.temperature,
                        t.seed * 1_000_003 + step,
                    )
                groups, scores = ctx.broadcast((groups, scores))
                ids = rollouts.prompt_ids(batch)
                encoded = [
                    encode(p, g, r, cfg.data.max_seq_len)
                    for p, g, r in zip(ids, groups, scores, strict=True)
                ]
                # GRPO's own update: group advantages, clipped surrogate, KL (grpo.make).
                st = loop.step(tr, tr.method.shard(encoded, ctx.rank, ctx.world))
                mean_reward = sum(map(sum, scores)) / sum(map(len, scores))
                # Only a group whose rewards differ has advantages: none, and nothing moves.
                live = float(sum(1 for r in scores if max(r) > min(r)))
                pushed = rollouts.push()
                extras = {**st.extras, "reward": mean_reward, "groups_with_signal": live, **pushed}
                st = dataclasses.replace(st, extras=extras)
                result.losses[tr.step] = st.loss
                result.tokens += st.tokens
                result.step_times.append((st.tokens, st.seconds))
                metrics.step(tr.step, sched.total_steps, sched.epoch_of(tr.step - 1), st)
                eval_row()
                if checkpoints.on_signal(stop):
                    break
                checkpoints.periodic()
            if not result.stopped_by_signal:
                checkpoints.final()
        except (RolloutError, RunFailedError, rewards.RewardError) as exc:
            if tr.step > 0 and checkpoints.saved_at != tr.step:
                loop.log(
                    ctx, f"online-grpo: stopping at step {tr.step}; writing a checkpoint first"
                )
                checkpoints.save("rollout-failure")
            raise RunFailedError(exc.message) from None
    finally:
        metrics.close()
    result.steps = tr.step
    result.seconds = time.monotonic() - started
    return result


def served_model(client: Client) -> str:
    listing = Retry(say=print)("models", lambda: client.call("GET", "/v1/models"))
    try:
        return str(listing["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise RolloutError(f"GET {client.shown}/v1/models: no model listed", False) from None
