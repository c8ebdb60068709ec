"""The trainer never shows a rollout URL's credentials (held-out fault class: leaks).

``runtime.rollout_url`` may carry a user part or an API gateway's ``?api_key=``; the dry run
prints the command and the resolved config, and both must show the URL redacted.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from .conftest import EXAMPLES, outputs, run_halo

pytestmark = pytest.mark.cpu


def test_a_dry_run_shows_the_rollout_url_without_its_credentials(tmp_path: Path) -> None:
    token, key = secrets.token_hex(8), secrets.token_hex(8)
    url = f"http://user:{token}@127.0.0.1:9/v1base?api_key={key}"
    proc = run_halo(
        "launch",
        "online-grpo",
        str(EXAMPLES / "online-grpo" / "config.yaml"),
        "--dry-run",
        "--",
        f"--model.name_or_path={EXAMPLES / 'models' / 'tiny-llama'}",
        f"--runtime.rollout_url={url}",
        *outputs(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for text in (proc.stdout, proc.stderr):
        assert token not in text and key not in text
    assert "rollout_url: http://127.0.0.1:9/v1base\n" in proc.stdout
    assert "--runtime.rollout_url=http://127.0.0.1:9/v1base" in proc.stdout
    assert not (tmp_path / "ck").exists(), "a dry run wrote a checkpoint folder"
