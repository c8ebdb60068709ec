"""No credential in what Halo echoes: `halo launch`'s command and config, the Slurm script,
the job record (halo.urls: keys that name a secret, a URL's userinfo and secret query keys).

These need halo's base dependencies only (a login node's): no torch, no tokenizers.
"""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest

from halo.cli import main
from halo.urls import HIDDEN, hide_argv, hide_url_secrets, is_secret_name

REPO = Path(__file__).resolve().parents[2]
SFT = REPO / "examples" / "sft" / "config.yaml"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("WANDB_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("AWS_SESSION_TOKEN", True),
        ("api_key", True),
        ("apiKey", True),
        ("db_password", True),
        ("client_secret", True),
        ("X-Amz-Signature", True),
        ("X-Amz-Credential", True),
        ("Authorization", True),
        ("AWS_ACCESS_KEY_ID", False),  # an identifier, not the secret
        ("AWS_SHARED_CREDENTIALS_FILE", False),  # where the secret is, not the secret
        ("num_key_value_heads", False),
        ("max_tokens", False),
        ("pad_token_id", False),
        ("keep_last", False),
        ("monkey", False),
    ],
)
def test_which_keys_name_a_secret(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_urls_keep_everything_but_their_credentials() -> None:
    assert (
        hide_url_secrets("https://user:pw@host:8443/v1?api_key=k&model=m&X-Amz-Signature=s")
        == f"https://host:8443/v1?api_key={HIDDEN}&model=m&X-Amz-Signature={HIDDEN}"
    )
    assert hide_url_secrets("http://host/v1") == "http://host/v1"
    assert hide_argv(
        [
            "--runtime.env.HF_TOKEN=hf_x",
            '--runtime.env={"HF_TOKEN": "hf_x", "PLAIN": "x"}',
            "--runtime.rollout_url=http://u:p@h/v1?token=t",
            "--lr=1e-3",
            "--model.config.num_key_value_heads=1",
        ]
    ) == [
        f"--runtime.env.HF_TOKEN={HIDDEN}",
        f'--runtime.env={{"HF_TOKEN": "{HIDDEN}", "PLAIN": "x"}}',
        f"--runtime.rollout_url=http://h/v1?token={HIDDEN}",
        "--lr=1e-3",
        "--model.config.num_key_value_heads=1",
    ]


def _overrides(token: str, key: str) -> list[str]:
    return [
        f"--runtime.env.HF_TOKEN={token}",
        f"--runtime.rollout_url=http://trainer:{key}@127.0.0.1:9/v1?api_key={key}",
        "--training.max_steps=2",
    ]


def test_a_dry_run_shows_the_command_env_and_config_without_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token, key = secrets.token_hex(8), secrets.token_hex(8)
    env = f'--runtime.env={{"WANDB_API_KEY": "{key}", "PLAIN": "visible"}}'
    args = [*_overrides(token, key), env, f"--runtime.paths.checkpoints={tmp_path}"]
    assert main(["launch", "sft", str(SFT), "--dry-run", "--", *args]) == 0
    out = capsys.readouterr()
    assert token not in out.out + out.err and key not in out.out + out.err
    command = next(line for line in out.out.splitlines() if line.startswith("command: "))
    assert "PLAIN=visible" in command and f"WANDB_API_KEY={HIDDEN}" in command
    assert f"--runtime.env.HF_TOKEN={HIDDEN}" in command
    assert f"--runtime.rollout_url=http://127.0.0.1:9/v1?api_key={HIDDEN}" in command
    assert f"    WANDB_API_KEY: '{HIDDEN}'\n    PLAIN: visible\n" in out.out  # the config


def test_the_slurm_script_reads_secrets_from_the_jobs_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token, key = secrets.token_hex(8), secrets.token_hex(8)
    overrides = _overrides(token, key)
    assert main(["launch", "sft", str(SFT), "--slurm", "--dry-run", "--", *overrides]) == 0
    script = capsys.readouterr().out
    assert token not in script and key not in script
    assert '--runtime.env.HF_TOKEN="${HALO_SECRET_1}"' in script
    assert '--runtime.rollout_url="${HALO_SECRET_2}" --training.max_steps=2' in script
    # The node's command, as bash expands it in a job whose environment sbatch filled: the
    # trainer gets the overrides as they were typed.
    node = script.rsplit("\\\n", 1)[1].split(" -- ", 1)[1]
    env = {"HALO_SECRET_1": token, "HALO_SECRET_2": overrides[1].partition("=")[2], "PATH": "/usr/bin:/bin"}  # fmt: skip
    words = subprocess.run(
        ["bash", "-c", f'set -u; printf "%s\\n" {node}'], env=env, capture_output=True, text=True
    ).stdout.splitlines()
    assert words == overrides


def test_the_slurm_submission_passes_secrets_in_its_environment(tmp_path: Path) -> None:
    from halo.train import config
    from halo.train.launch import slurm

    token, key = secrets.token_hex(8), secrets.token_hex(8)
    overrides = [*_overrides(token, key), f"--runtime.paths.logs={tmp_path}"]
    cfg = config.load(SFT, "sft", overrides)
    job = slurm.job_from_config("sft", SFT, cfg, 1, overrides)
    assert token not in repr(job) and key not in repr(job)

    class Cluster:
        """A cluster that keeps what sbatch would get: the script and the environment."""

        got: tuple[str, dict[str, str]] = ("", {})

        def available(self) -> str | None:
            return None

        def partitions(self) -> list[str]:
            return []

        def submit(self, script: str, env: dict[str, str] | None = None) -> str:
            Cluster.got = (script, dict(env or {}))
            return "42"

    assert slurm.launch(job, False, Cluster()) == 0
    script, env = Cluster.got
    assert token not in script and env == {
        "HALO_SECRET_1": token,
        "HALO_SECRET_2": overrides[1].partition("=")[2],
    }


def test_a_job_record_never_holds_a_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HALO_SCRATCH", str(tmp_path))
    token = secrets.token_hex(8)
    rc = main(["job", "start", str(SFT), "--", f"--runtime.env.HF_TOKEN={token}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith(f"halo: error: --runtime.env.HF_TOKEN={HIDDEN}: a job record never")
    assert token not in err
    assert not list(tmp_path.rglob("job.json"))
