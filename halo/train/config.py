"""The run config: one YAML file -> validated pydantic models (through halo.schema).

`runtime` describes the container (job name, paths, devices, parallelism, environment); the
other sections describe training. Validation reports every problem at once, each as
``<key path>: <what was expected>``; unknown keys, duplicate YAML keys and non-finite numbers
are errors. Relative paths in the YAML are relative to the YAML file; relative paths given as
command-line overrides are relative to the current directory (where the person typed them).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)

from halo import schema
from halo.errors import HaloError

# Paths arrive as strings from YAML; every other field is strict (no "3" for 3).
PathField = Annotated[Path, Field(strict=False)]
# Counts fit an int32, so a huge number is this key's error, not an overflow deep in torch.
COUNT_MAX = 2**31 - 1
Positive = Annotated[int, Field(gt=0, le=COUNT_MAX)]
NonNegative = Annotated[int, Field(ge=0, le=COUNT_MAX)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Paths(Section):
    checkpoints: PathField = Path("runs/checkpoints")
    logs: PathField = Path("runs/logs")


class Rendezvous(Section):
    """torchrun's c10d rendezvous, for more than one node."""

    # HOST:PORT of the c10d store (on the first node; under Slurm the script fills it in).
    endpoint: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:\[\]-]+:[0-9]{1,5}$")] | None = None
    # The job's id: every node of one job passes the same (default: runtime.job_name).
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")] | None = None
    # How long the first node waits for all the others, and, once the minimum is there, for
    # late ones: a node that never joins is an error after join_timeout_s, not a hang.
    join_timeout_s: Positive = 600
    last_call_timeout_s: Positive = 30


class Slurm(Section):
    """`halo launch --slurm`: the sbatch script's resources (flags override these)."""

    partition: str | None = None
    account: str | None = None
    time: Annotated[str, Field(pattern=r"^[0-9:-]+$")] | None = None  # sbatch --time
    gpus_per_node: NonNegative = 0
    cpus_per_task: Positive | None = None
    # A pyxis/enroot image (a .sqsh file or a docker ref) or an Apptainer .sif; or a venv
    # folder holding halo and the stack (DIR/bin/halo); neither: this interpreter's halo.
    container: str | None = None
    container_mounts: list[str] = Field(default_factory=list)
    venv: PathField | None = None
    # Seconds before the time limit at which every process of the step gets SIGTERM: enough
    # to finish a batch and write the emergency checkpoint.
    grace_s: Positive = 300
    requeue: bool = False


class Profile(Section):
    """torch.profiler around a window of steps: a Chrome/Perfetto trace per profiled rank under
    $HALO_DATA_ROOT/profiling/<job>/ and a table of the top operators in the log."""

    start_step: Positive = 1  # the first profiled step (1-based, as the progress lines count)
    steps: Positive = 2
    # The ranks that profile (every rank of the window joins the same collectives either way).
    ranks: Literal["all"] | list[Annotated[int, Field(ge=0)]] = Field(default_factory=lambda: [0])


class Parallelism(Section):
    """One device mesh (halo.train.parallel): dp_replicate x dp_shard x cp x tp processes, with
    expert parallelism borrowing ep of the dp_shard ranks. The last three are the seed's flags
    (--tensor_parallel_size, --context_parallel_size, --expert_parallel_size)."""

    # Unset: 1, or every rank the others leave under parallel_mode ddp.
    data_parallel_replicate_size: Positive | None = None
    # Unset: every rank the others leave (FSDP2 shards over these).
    data_parallel_shard_size: Positive | None = None
    context_parallel_size: Positive = 1
    tensor_parallel_size: Positive = 1
    expert_parallel_size: Positive = 1
    # auto: DeepEP where it loads on GPUs, else all-to-all over torch.distributed.
    expert_parallel_backend: Literal["auto", "all_to_all", "deepep"] = "auto"
    # The expert matmul: torch._grouped_mm where the build has it (auto), or a loop.
    grouped_mm: Literal["auto", "grouped", "loop"] = "auto"


class Runtime(Section):
    job_name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    paths: Paths = Field(default_factory=Paths)
    # GPU devices the job may use: "all", or a list of indices (sets CUDA_VISIBLE_DEVICES).
    devices: Literal["all"] | list[Annotated[int, Field(ge=0)]] = "all"
    # auto: none for one process; fsdp on GPUs, ddp on the CPU for several.
    parallel_mode: Literal["auto", "none", "ddp", "fsdp"] = "auto"
    # auto: python for one process, torchrun for several.
    launcher: Literal["auto", "python", "torchrun", "accelerate"] = "auto"
    env: dict[str, str] = Field(default_factory=dict)
    # Nodes and processes per node (`--nnodes`, `--nproc-per-node`; unset: one per GPU).
    nnodes: Positive = 1
    nproc_per_node: Positive | None = None
    # Fixed order of the nodes when set (else c10d assigns ranks as nodes join).
    node_rank: NonNegative | None = None
    rdzv: Rendezvous = Field(default_factory=Rendezvous)
    # A collective that waits longer than this fails the rank (and so the job): no hangs.
    collective_timeout_s: Positive = 600
    # NCCL's network: efa (aws-ofi-nccl + libfabric; an error when they do not load), socket
    # (TCP), or auto (NCCL's own choice). runtime.env overrides any default it sets.
    fabric: Literal["auto", "socket", "efa"] = "auto"
    # The network interface for NCCL/gloo sockets (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME).
    socket_ifname: str | None = None
    slurm: Slurm = Field(default_factory=Slurm)
    # `halo job start`: a timer stops the job (gracefully, as `halo job stop`) after this long.
    max_duration_hours: Annotated[float, Field(gt=0)] | None = None
    # online-grpo: the rollout server's OpenAI API (else $HALO_ROLLOUT_URL).
    rollout_url: str | None = None
    # Trackers that get every metrics.jsonl row as well (rank 0 only): wandb (offline unless
    # WANDB_API_KEY is set and WANDB_MODE allows it), tensorboard (<logs>/<job>/tensorboard).
    # A tracker that fails is one warning line; training and metrics.jsonl go on.
    report_to: list[Literal["wandb", "tensorboard"]] = Field(default_factory=list)
    # Off unless set: no profiler object exists, nothing is checked per step.
    profile: Profile | None = None
    parallelism: Parallelism = Field(default_factory=Parallelism)


class Model(Section):
    # A Hugging Face model: a local directory, or a Hub id already in the cache (HF_HOME).
    name_or_path: str | None = None
    # Or a fresh model from a Hugging Face config (model_type plus its fields), initialised
    # from training.seed; vocab_size defaults to the tokenizer's size.
    config: dict[str, Any] | None = None
    # Tokenizer folder or Hub id (tokenizer.json + tokenizer_config.json); default name_or_path.
    tokenizer: str | None = None
    # A Jinja chat template file that replaces the tokenizer's own.
    chat_template: PathField | None = None
    attention: Literal["auto", "sdpa", "fa2", "fa3", "fa4"] = "auto"
    activation_checkpointing: bool = False
    # Mixture-of-experts models: the load-balancing loss's weight (unset: the model config's
    # router_aux_loss_coef) and the router z-loss's (off at 0).
    router_aux_loss_coef: Annotated[float, Field(ge=0)] | None = None
    router_z_loss_coef: Annotated[float, Field(ge=0)] = 0.0

    @model_validator(mode="after")
    def _one_source(self) -> Model:
        if (self.name_or_path is None) == (self.config is None):
            raise ValueError("set exactly one of name_or_path (pretrained) or config (fresh)")
        if self.config is not None and not isinstance(self.config.get("model_type"), str):
            raise ValueError("config needs a model_type (llama, qwen2, qwen3, ...)")
        if self.name_or_path is None and self.tokenizer is None:
            raise ValueError("a fresh model (config) needs a tokenizer (folder or Hub id)")
        return self


# raw: rows as they are, for a method that reads them itself (environmental-grpo).
DataFormat = Literal[
    "auto", "messages", "sharegpt", "prompt_completion", "preference", "grpo", "raw"
]


# An S3 object (jsonl or parquet) or a prefix of shards (ending in /), read with boto3 and
# cached under $HALO_DATA_ROOT/s3_datasets (halo.train.data.s3data).
S3_URL = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/.+$"


class S3Ref(str):
    """An s3:// URL where a local path may stand: it has a path's ``name`` and ``suffix``, so
    what names a source by its file (a method's first-example note) names it by its key."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        return Path(self.name).suffix


S3Url = Annotated[str, Field(pattern=S3_URL), AfterValidator(S3Ref)]


def _no_other_url(value: Any) -> Any:
    """A URL that is no valid s3:// one must not pass on as a (mangled) local path."""
    if isinstance(value, str) and "://" in value and not re.match(S3_URL, value):
        raise ValueError("expected a local path or s3://BUCKET/KEY (a prefix ends in /)")
    return value


DataPath = Annotated[S3Url | PathField, BeforeValidator(_no_other_url)]


class Source(Section):
    path: DataPath
    format: DataFormat = "auto"
    # interleave: the chance that the next example comes from this source.
    probability: Annotated[float, Field(gt=0, le=1)] | None = None
    # ShareGPT as in LLaMA-Factory's dataset_info: which column holds the turns (messages),
    # the system prompt (system) and the tools (tools) ...
    columns: dict[str, str] = Field(default_factory=dict)
    # ... and the keys and values inside a turn (role_tag, content_tag, user_tag, ...).
    tags: dict[str, str] = Field(default_factory=dict)


class Data(Section):
    train: DataPath | list[Source]
    # A held-out set; or eval_fraction of train held out (deterministic, by training.seed).
    eval: DataPath | list[Source] | None = None
    eval_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.0
    # concat: every source in order. interleave_under: draw the next example's source by
    # probability, stop when the first source is exhausted (undersampling the others).
    # interleave_over: the same, but a source that runs out starts again, until every
    # source has been seen whole (oversampling). interleave is interleave_under.
    mix: Literal["concat", "interleave", "interleave_under", "interleave_over"] = "concat"
    # Longer examples are truncated (SFT) or dropped with a count (GRPO, DPO).
    max_seq_len: Positive = 256
    # SFT: each micro-batch is one row of concatenated examples, no padding (position_ids
    # restart per example, so attention never crosses an example's border).
    packing: bool = False

    def sources(self, which: str = "train") -> list[Source]:
        value = self.train if which == "train" else self.eval
        if value is None:
            return []
        return list(value) if isinstance(value, list) else [Source(path=value)]


class Optim(Section):
    # At most 1e30: AdamW's step (lr / bias correction) must fit in fp32.
    lr: Annotated[float, Field(gt=0, le=1e30)] = 1e-3
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    betas: Annotated[
        list[Annotated[float, Field(ge=0, lt=1)]], Field(min_length=2, max_length=2)
    ] = Field(default_factory=lambda: [0.9, 0.95])
    eps: Annotated[float, Field(gt=0)] = 1e-8
    grad_clip: Annotated[float, Field(ge=0)] = 1.0
    scheduler: Literal["constant", "cosine", "linear"] = "cosine"
    warmup_steps: NonNegative = 0
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = 0.1


class Training(Section):
    # Below 2**32: torch's generators take (seed * 1_000_003 + epoch) < 2**64.
    seed: Annotated[int, Field(ge=0, lt=2**32)] = 0
    # Sequences (SFT), pairs (DPO) or groups (GRPO) per optimizer step, over all processes.
    global_batch_size: Positive = 8
    # Per process per forward; the rest is gradient accumulation. Unset: the whole share.
    micro_batch_size: Positive | None = None
    epochs: Positive = 1
    # Stops earlier than `epochs` when set.
    max_steps: Positive | None = None
    precision: Literal["fp32", "bf16"] = "fp32"
    # Eval loss every N steps (0: only at the end), when data has an eval set.
    eval_every_steps: NonNegative = 0


class Checkpoint(Section):
    # 0: only at the end (and on SIGTERM/SIGINT).
    every_steps: NonNegative = 0
    # Complete checkpoints of this run to keep; 0 keeps all.
    keep_last: NonNegative = 2
    # false: start a new run lineage in the job folder; older checkpoints are left alone.
    resume: bool = True
    # hf: full weights from rank 0 (a Hugging Face folder); dcp: every rank writes its shards
    # (torch.distributed.checkpoint; `halo export` consolidates). auto: dcp under a mesh
    # (tp, cp or ep > 1) of several processes, else hf.
    format: Literal["auto", "hf", "dcp"] = "auto"


class Logging(Section):
    every_steps: Positive = 1


class Grpo(Section):
    clip_eps: Annotated[float, Field(gt=0)] = 0.2
    kl_coef: Annotated[float, Field(ge=0)] = 0.0
    # current: the policy at the start of each batch (ratio 1 on its first update pass).
    # reference: the frozen starting model is taken as the behaviour policy for the whole run.
    old_policy: Literal["current", "reference"] = "current"
    updates_per_batch: Positive = 1
    # Advantage = (reward - group mean) / (std + adv_eps): std of the group (sample std, as
    # TRL), of the whole batch, or none (Dr. GRPO).
    scale_rewards: Literal["group", "batch", "none"] = "group"
    adv_eps: Annotated[float, Field(gt=0)] = 1e-4
    # token: every completion token weighs the same (DAPO); sequence: each completion's mean
    # token loss, averaged over completions (DeepSeekMath's GRPO).
    loss_type: Literal["token", "sequence"] = "token"


class Rollout(Section):
    """online-grpo: how completions are sampled, scored and the weights pushed back."""

    # A Python callable f(completion: str, row: dict) -> float, as 'package.module:function'.
    reward: str = "halo.train.rewards:exact_match"
    n: Annotated[int, Field(ge=2)] = 4  # completions per prompt: one group
    max_tokens: Positive = 32
    temperature: Annotated[float, Field(ge=0)] = 1.0
    # Held-out prompts (data.eval) sampled every this many steps (n each, this temperature,
    # a fixed seed): the mean reward curve. 0: never.
    eval_every_steps: NonNegative = 5
    timeout_s: Annotated[float, Field(gt=0)] = 120.0
    # Tries of a rollout or push whose failure is transient (server down, timeout, 5xx).
    attempts: Positive = 2
    backoff_s: Annotated[float, Field(ge=0)] = 5.0
    # server: the server at runtime.rollout_url; local: environmental-grpo samples from the
    # policy in the trainer's own process (small models, tests: no server, nothing pushed).
    backend: Literal["server", "local"] = "server"
    # The served model's name (unset: the first the server lists).
    model_name: str | None = None
    # Where pushed weights are written (default <checkpoints>/<job>/served), and the same
    # folder as the server sees it when it runs elsewhere (another container's mount).
    export_dir: PathField | None = None
    export_dir_on_server: str | None = None
    # Largest gap between the server's and the policy's probe log-probs after a push.
    check_tolerance: Annotated[float, Field(gt=0)] = 1e-3


class Dpo(Section):
    beta: Annotated[float, Field(gt=0)] = 0.1


class Simpo(Section):
    """SimPO: -log sigmoid(beta * (mean logp chosen - mean logp rejected) - gamma)."""

    beta: Annotated[float, Field(gt=0)] = 2.0
    # The target reward margin (finite: every Section refuses inf and nan).
    gamma: float = 1.0


class Smpo(Section):
    """SMPO (Vikhr's effective_llm_alignment): a margin on mean log-probs plus balancing SFT."""

    beta: Annotated[float, Field(gt=0)] = 1.1
    # The smallest margin wanted between chosen and rejected mean log-probs ...
    margin_min: Annotated[float, Field(ge=0)] = 0.35
    # ... and, for smooth_double_bound, the width of the band above it.
    margin_delta: Annotated[float, Field(ge=0)] = 0.2
    # The SFT term's weight on the chosen response; the rest goes to the rejected one.
    chosen_sft_ratio: Annotated[float, Field(ge=0, le=1)] = 0.75
    loss_type: Literal["sigmoid", "hinge", "ipo", "smooth_lower_bound", "smooth_double_bound"] = (
        "smooth_lower_bound"
    )


class Classification(Section):
    text_column: str = "text"
    label_column: str = "label"
    # The label names in id order; unset: the labels found in the training data, sorted.
    labels: Annotated[list[str], Field(min_length=2)] | None = None
    # Or only their number, for integer labels 0..num_labels-1.
    num_labels: Annotated[int, Field(ge=2, le=COUNT_MAX)] | None = None


class Embedding(Section):
    query_column: str = "query"
    positive_column: str = "positive"
    negatives_column: str = "negatives"
    # Hard negatives per row (the first N of the column); unset: as many as every row has.
    hard_negatives: NonNegative | None = None
    # InfoNCE's temperature on cosine similarities.
    temperature: Annotated[float, Field(gt=0)] = 0.05
    # mean: the mean of the last hidden states over the text's tokens; last: the last token's.
    pooling: Literal["mean", "last"] = "mean"


class Environment(Section):
    """environmental-grpo: the environment, and the limits of one episode."""

    # 'package.module:Factory' or 'file.py:Factory' (relative to the YAML): called with
    # ``kwargs`` once per episode, it returns an object with reset(row) and step(action).
    path: Annotated[str, Field(pattern=r"^[^:\s]+:[A-Za-z_][A-Za-z0-9_]*$")]
    kwargs: dict[str, Any] = Field(default_factory=dict)
    # Model turns per episode.
    max_turns: Positive = 4
    # Tokens per episode: prompt, the model's and the environment's (unset: data.max_seq_len).
    max_tokens: Positive | None = None


class Config(Section):
    runtime: Runtime
    data: Data
    model: Model
    optim: Optim = Field(default_factory=Optim)
    training: Training = Field(default_factory=Training)
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    logging: Logging = Field(default_factory=Logging)
    grpo: Grpo | None = None
    dpo: Dpo | None = None
    simpo: Simpo | None = None
    smpo: Smpo | None = None
    classification: Classification | None = None
    embedding: Embedding | None = None
    environment: Environment | None = None
    rollout: Rollout | None = None

    @property
    def job_dir(self) -> Path:
        return self.runtime.paths.checkpoints / self.runtime.job_name

    @property
    def log_dir(self) -> Path:
        return self.runtime.paths.logs / self.runtime.job_name


# Sections only one method reads; elsewhere they are a mistake worth reporting.
METHOD_SECTIONS = {
    "grpo": ("offline-grpo", "online-grpo", "environmental-grpo"),
    "dpo": ("preference/dpo",),
    "simpo": ("preference/simpo",),
    "smpo": ("preference/smpo",),
    "classification": ("classification",),
    "embedding": ("embedding",),
    "environment": ("environmental-grpo",),
    "rollout": ("online-grpo", "environmental-grpo"),
}
# The sections each method gets with their defaults when the YAML has none.
DEFAULT_SECTIONS: dict[str, tuple[tuple[str, type[Section]], ...]] = {
    "offline-grpo": (("grpo", Grpo),),
    "online-grpo": (("grpo", Grpo), ("rollout", Rollout)),
    "environmental-grpo": (("grpo", Grpo), ("rollout", Rollout)),
    "preference/dpo": (("dpo", Dpo),),
    "preference/simpo": (("simpo", Simpo),),
    "preference/smpo": (("smpo", Smpo),),
    "classification": (("classification", Classification),),
    "embedding": (("embedding", Embedding),),
}
# Keys whose string values are local paths (resolved against the YAML's folder).
PATH_KEYS = {
    "checkpoints", "logs", "train", "eval", "path", "chat_template", "export_dir", "venv"
}  # fmt: skip
# Keys that name a local folder when one exists there, else a Hub id.
MAYBE_PATH_KEYS = {"name_or_path", "tokenizer"}


def parse_yaml(text: str, where: str) -> Any:
    return schema.load_yaml(text, where)


def read_yaml(path: Path) -> dict[str, Any]:
    data = schema.read_yaml(path)
    if not isinstance(data, dict):
        raise HaloError(f"{path}: expected a mapping of sections at the top level")
    return data


def _resolve(value: Any, base: Path, maybe: bool = False) -> Any:
    if not isinstance(value, str) or not value or Path(value).is_absolute() or "://" in value:
        return value
    local = (base / value).resolve()
    return str(local) if not maybe or local.is_dir() else value


def resolve_paths(raw: dict[str, Any], base: Path) -> None:
    """Make the YAML's relative paths relative to ``base`` (in place, before validation)."""
    rt = raw.get("runtime")
    if isinstance(rt, dict):
        paths = rt.setdefault("paths", {})
        if isinstance(paths, dict):
            for k, default in (("checkpoints", "runs/checkpoints"), ("logs", "runs/logs")):
                paths[k] = _resolve(paths.get(k, default), base)
        slurm = rt.get("slurm")
        if isinstance(slurm, dict) and slurm.get("venv") is not None:
            slurm["venv"] = _resolve(slurm["venv"], base)
    data = raw.get("data")
    if isinstance(data, dict):
        for key in ("train", "eval"):
            v = data.get(key)
            if isinstance(v, list):
                for src in v:
                    if isinstance(src, dict):
                        src["path"] = _resolve(src.get("path"), base)
            else:
                data[key] = _resolve(v, base)
    env = raw.get("environment")
    if isinstance(env, dict) and isinstance(env.get("path"), str):
        file, sep, name = env["path"].rpartition(":")
        if sep and file.endswith(".py"):  # a file next to the YAML, not an importable module
            env["path"] = f"{_resolve(file, base)}:{name}"
    ro = raw.get("rollout")
    if isinstance(ro, dict) and ro.get("export_dir") is not None:
        ro["export_dir"] = _resolve(ro["export_dir"], base)
    model = raw.get("model")
    if isinstance(model, dict):
        model["chat_template"] = _resolve(model.get("chat_template"), base)
        for key in MAYBE_PATH_KEYS:
            model[key] = _resolve(model.get(key), base, maybe=True)
        for key in ("chat_template", *MAYBE_PATH_KEYS):
            if model[key] is None:
                del model[key]


def _check(
    cfg: Config, method: str | None, raw: dict[str, Any], model_class: bool = True
) -> list[str]:
    """Rules that span keys; field types and ranges were checked by the models."""
    errors = []
    d = cfg.data
    for which in ("train", "eval"):
        for n, src in enumerate(d.sources(which)):
            where = f"data.{which}" + (f"[{n}].path" if isinstance(getattr(d, which), list) else "")
            if isinstance(src.path, Path) and not src.path.is_file():
                errors.append(f"{where}: file not found: {src.path}")
    if d.mix != "concat":
        probs = [s.probability for s in d.sources()]
        if None in probs:
            errors.append("data.mix: interleave needs a probability on every data.train source")
        elif not math.isclose(sum(probs), 1.0, abs_tol=1e-6):  # type: ignore[arg-type]
            errors.append(f"data.train: probabilities add up to {sum(probs)}, expected 1")  # type: ignore[arg-type]
    if d.eval is not None and d.eval_fraction:
        errors.append("data.eval_fraction: set either data.eval or data.eval_fraction, not both")
    if (
        cfg.training.micro_batch_size
        and cfg.training.micro_batch_size > cfg.training.global_batch_size
    ):
        errors.append("training.micro_batch_size: larger than training.global_batch_size")
    if cfg.model.config is not None:
        from halo.train.models import model_config

        errors += model_config.errors(cfg.model.config, model_class)
    if method == "environmental-grpo" and cfg.environment is None:
        errors.append("environment: environmental-grpo needs this section (environment.path)")
    if cfg.rollout is not None and cfg.rollout.backend == "local" and method == "online-grpo":
        errors.append("rollout.backend: local samples only for environmental-grpo")
    if method is not None:
        for section, owners in METHOD_SECTIONS.items():
            if section in raw and method not in owners:
                errors.append(
                    f"{section}: section is for method {' or '.join(owners)}, not {method}"
                )
    return errors


def _refuse(where: str, errors: list[str]) -> None:
    if errors:
        n = len(errors)
        raise HaloError(f"{where}: {n} problem{'s' if n > 1 else ''}: " + "; ".join(errors))


def from_dict(
    raw: dict[str, Any], method: str | None, where: str, model_class: bool = True
) -> Config:
    cfg = schema.validate(Config, raw, where)
    _refuse(where, _check(cfg, method, raw, model_class))
    for section, kind in DEFAULT_SECTIONS.get(method or "", ()):
        if getattr(cfg, section) is None:
            setattr(cfg, section, kind())
    return cfg


def load(
    path: Path, method: str | None, overrides: list[str] | None = None, model_class: bool = True
) -> Config:
    """Read, resolve paths, apply ``--key=value`` overrides, validate.

    ``model_class=False`` leaves out only what model.config's transformers class says of it
    (`check_model_class`): that class imports transformers and torch, seconds of CPU.
    """
    from halo.train import overrides as ov

    # realpath, not Path.resolve: on a symlink loop resolve raises RuntimeError; this leaves
    # the loop to the reader, which names the file in one line.
    path = Path(os.path.realpath(path))
    raw = read_yaml(path)
    resolve_paths(raw, path.parent)
    ov.apply(raw, ov.parse(overrides or []), schema=Config, resolve_paths=resolve_paths)
    return from_dict(raw, method, str(path), model_class)


def check_model_class(cfg: Config, path: Path) -> None:
    """What `load(..., model_class=False)` left out: model.config against its class."""
    if cfg.model.config is not None:
        from halo.train.models import model_config

        _refuse(str(Path(os.path.realpath(path))), model_config.errors(cfg.model.config))


def to_dict(cfg: Config) -> dict[str, Any]:
    """Plain data (paths as strings, unset method sections dropped) for YAML/JSON output."""
    return cfg.model_dump(mode="json", exclude_none=True)


def dump_yaml(cfg: Config) -> str:
    """The config as it is shown (a dry run prints it): URLs without their credentials."""
    return yaml.safe_dump(shown(cfg), sort_keys=False)


def shown(cfg: Config) -> dict[str, Any]:
    """The config as it may be shown or recorded (a dry run, a tracker's config): URLs without
    their credentials, and the value of every key that names a secret hidden."""
    from halo.urls import hide_secrets, redact_url

    data = to_dict(cfg)
    runtime = data.get("runtime") or {}
    if runtime.get("rollout_url"):
        runtime["rollout_url"] = redact_url(runtime["rollout_url"])
    hidden = hide_secrets(data)
    assert isinstance(hidden, dict)
    return hidden
