"""Environmental GRPO: the policy plays multi-turn episodes with an environment and learns from
their rewards, group-relative over the ``rollout.n`` episodes of each row.

Per step: a global batch of rows (the seeded order every method uses) -> ``rollout.n``
episodes of each, played turn by turn (halo.train.methods.environment: ``reset``/``step``,
tool calls, the turn and token limits, an environment that fails ends only its episode) ->
GRPO's update on exactly the tokens of each episode, the loss on the model's own tokens only
(group advantages, clipped surrogate, optional KL: halo.train.methods.grpo) -> with a server,
the new weights pushed and checked before the next rollout, as online-grpo does.

Turns are sampled by the rollout server online-grpo uses (vLLM or SGLang through the OpenAI
API, ``runtime.rollout_url``), or with ``rollout.backend: local`` by the policy itself in this
process (small models, tests; nothing pushed). Held-out rows (``data.eval``) are played every
``rollout.eval_every_steps`` with a fixed seed: their mean reward is ``eval_reward``.

Each step's metrics row has the mean episode reward, the mean turns, and how many episodes
ended by an environment error (``env_errors``; the first error of a step is also logged), by a
token limit or a cut turn (``truncated``) or at ``max_turns`` (``turn_limit``). A rollout
server that fails for good stops the run with exit 1, after a checkpoint, as in online-grpo.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from halo.rollout.client import Client, Retry, RolloutError, Sample
from halo.train import rewards
from halo.train.config import Config, Grpo
from halo.train.data import batching, examples
from halo.train.data.tokenizer import ChatTokenizer
from halo.train.loop import loop
from halo.train.loop.stopping import StopFlag
from halo.train.methods import environment, environmental_grpo_data, grpo, grpo_data, online_grpo
from halo.train.methods.local_sampler import LocalSampler
from halo.train.methods.online_grpo import RunFailedError
from halo.train.parallel import distributed
from halo.train.state import Method, Result, StepStats, Trainer


@dataclasses.dataclass(frozen=True)
class Retried:
    """The server's client as a Sampler: transient failures retried (rollout.attempts)."""

    client: Client
    retry: Retry
    what: str

    def complete(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        max_tokens: int | Sequence[int],
        temperature: float,
        seed: int,
    ) -> list[list[Sample]]:
        return self.retry(
            self.what, lambda: self.client.complete(prompts, n, max_tokens, temperature, seed)
        )


def group(episodes: list[environment.Episode], pad_id: int) -> grpo_data.Group:
    """A group as GRPO trains on it: each episode's tokens, trained on where the model wrote.
    An episode that failed before its prompt (reset raised) is one untrained padding token,
    not a row of no tokens at all (which attention kernels need not accept)."""
    seqs = tuple(
        examples.shift(ep.ids, ep.train)
        if len(ep.ids) > 1
        else examples.shift([pad_id] * 2, [False] * 2)
        for ep in episodes
    )
    return grpo_data.Group(seqs, tuple(ep.reward for ep in episodes))


def build(cfg: Config, tok: ChatTokenizer) -> Method:
    """GRPO's update (grpo.method) over the run's rows; the episodes come at train time."""
    g, ro, env = cfg.grpo or Grpo(), cfg.rollout, cfg.environment
    assert ro is not None and env is not None  # the config gives environmental-grpo both
    environment.load(env.path)  # an environment that does not import: before any model
    train, evals = batching.load(
        environmental_grpo_data.sources(cfg.data), cfg.training.seed, environmental_grpo_data.parse
    )
    notes = [
        f"environmental-grpo: {len(train)} rows, {len(evals)} held out (their mean reward every "
        f"{ro.eval_every_steps} steps: eval_reward); environment {env.path}, n {ro.n}, "
        f"max_turns {env.max_turns}, max_tokens {env.max_tokens or cfg.data.max_seq_len} "
        f"per episode and {ro.max_tokens} per turn, temperature {ro.temperature}, "
        f"sampled by {'this process' if ro.backend == 'local' else 'the rollout server'}; "
        f"clip {g.clip_eps}, kl_coef {g.kl_coef}, scale_rewards {g.scale_rewards}",
        *environmental_grpo_data.describe(cfg, tok),
    ]
    m = grpo.method(cfg, tok, train, evals, notes)
    m.name = "environmental-grpo"
    return m


@dataclasses.dataclass
class Player:
    """Plays a batch of rows on the main process (the others get its episodes)."""

    cfg: Config
    tr: Trainer
    factory: Callable[..., Any]
    sampler: Callable[[str], environment.Sampler]

    def play(
        self, what: str, rows: list[tuple[dict[str, Any], str]], seed: int
    ) -> list[list[environment.Episode]]:
        cfg, ctx = self.cfg, self.tr.ctx
        assert cfg.rollout is not None and cfg.environment is not None
        env = cfg.environment
        limits = environment.Limits(
            env.max_turns, env.max_tokens or cfg.data.max_seq_len, cfg.rollout.max_tokens
        )
        groups = None
        if ctx.is_main:
            groups = environment.play(
                self.factory, env.kwargs, rows, cfg.rollout.n, self.tr.tok, self.sampler(what),
                limits, cfg.rollout.temperature, seed,
            )  # fmt: skip
        return ctx.broadcast(groups)


def _sampler(cfg: Config, tr: Trainer, ctx: distributed.Context) -> tuple[Any, Any]:
    """(what samples a batch, the online-grpo rollouts that push weights, or None)."""
    ro = cfg.rollout
    assert ro is not None
    if ro.backend == "local":
        local = LocalSampler(tr.model, tr.tok) if ctx.is_main else None
        return (lambda what: local), None
    client = Client(online_grpo.server_url(cfg), ro.model_name or "", ro.timeout_s)
    if not client.model and ctx.is_main:
        client = Client(client.url, online_grpo.served_model(client), ro.timeout_s)
    retry = Retry(ro.attempts, ro.backoff_s, say=lambda line: loop.log(ctx, line))
    probe = tr.tok.render(online_grpo.PROBE).ids
    pusher = online_grpo.Rollouts(cfg, tr, client, retry, rewards.exact_match, probe)
    loop.log(ctx, f"environmental-grpo: sampling from {client.shown} ({client.model})")
    return (lambda what: Retried(client, retry, what)), pusher


def train(
    cfg: Config,
    method: Method,
    tok: ChatTokenizer,
    ctx: distributed.Context,
    stop: StopFlag | None = None,
    checkpoint_hook_sleep: tuple[int, float] | None = None,
) -> Result:
    t, ro, env = cfg.training, cfg.rollout, cfg.environment
    assert ro is not None and env is not None
    stop = stop or StopFlag()
    rows: list[tuple[dict[str, Any], str]] = method.items
    held_out: list[tuple[dict[str, Any], str]] = method.eval_items
    tr, sched, resumed = loop.start(cfg, method, tok, ctx)
    sampler, pusher = _sampler(cfg, tr, ctx)
    player = Player(cfg, tr, environment.load(env.path), sampler)
    loop.log(ctx, f"environmental-grpo: {t.global_batch_size} rows x {ro.n} episodes per step")
    metrics = loop.Metrics(cfg.log_dir, ctx, cfg.logging.every_steps)
    result = Result(tr.step, {}, 0, 0.0, False, None)
    checkpoints = loop.Checkpoints(tr, sched, result, resumed, checkpoint_hook_sleep)
    started = time.monotonic()

    def eval_row(first: bool = False) -> None:
        every = ro.eval_every_steps
        if held_out and every and (first or tr.step % every == 0 or tr.step == sched.total_steps):
            groups = player.play("eval", held_out, t.seed)
            metrics.eval(
                tr.step, environment.Tally().add(groups).metrics()["reward"], "eval_reward"
            )

    try:
        try:
            pushed: dict[str, float] = pusher.push() if pusher else {}
            eval_row(first=True)
            for step in range(tr.step, sched.total_steps):
                batch = [rows[i] for i in sched.global_batch_of(step)]
                groups = player.play(f"rollout step {step + 1}", batch, t.seed * 1_000_003 + step)
                tally = environment.Tally().add(groups)
                if tally.first_error:
                    errors = tally.by_status.get("error", 0)
                    loop.log(
                        ctx,
                        f"environmental-grpo: step {step + 1}: {errors} episode(s) ended by an "
                        f"environment error; the first: {tally.first_error}",
                    )
                encoded = [group(g, tok.pad_id) for g in groups]
                if not any(w for x in encoded for s in x.seqs for w in s.weights):
                    # Every episode failed before the model wrote a token: nothing to learn.
                    loop.log(ctx, f"environmental-grpo: step {step + 1}: no model tokens")
                    tr.step += 1
                    tr.scheduler.step()
                    st = StepStats(float("nan"), {}, 0, 1e-9, tr.scheduler.get_last_lr()[0])
                else:
                    st = loop.step(tr, tr.method.shard(encoded, ctx.rank, ctx.world))
                live = float(sum(1 for x in encoded if max(x.rewards) > min(x.rewards)))
                pushed = pusher.push() if pusher else {}
                extras = {**st.extras, **tally.metrics(), "groups_with_signal": live, **pushed}
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
        except (RolloutError, RunFailedError) as exc:
            if tr.step > 0 and checkpoints.saved_at != tr.step:
                loop.log(ctx, f"environmental-grpo: stopping at step {tr.step}; checkpoint first")
                checkpoints.save("rollout-failure")
            raise RunFailedError(exc.message) from None
    finally:
        metrics.close()
    result.steps = tr.step
    result.seconds = time.monotonic() - started
    return result
