"""The AWS edge, and all of it: a login password for ECR Public, from the AWS CLI.

ECR Public's API answers in us-east-1 only, whichever region the images are pulled from.
In CI the workflow's OIDC role and `aws-actions/amazon-ecr-login` do this instead; nothing
here creates repositories: that is done once, by hand (README, "Publishing").
"""

from __future__ import annotations

import subprocess

from halo.errors import HaloError

REGION = "us-east-1"
USERNAME = "AWS"


def login_password(aws: str = "aws") -> str:
    """`aws ecr-public get-login-password --region us-east-1`: a 12-hour registry password."""
    argv = [aws, "ecr-public", "get-login-password", "--region", REGION]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    except FileNotFoundError:
        raise HaloError(
            f"{aws}: not found; install the AWS CLI (v2) and configure credentials"
        ) from None
    except subprocess.TimeoutExpired:
        raise HaloError(f"{' '.join(argv)}: no answer in 120 s") from None
    password = proc.stdout.strip()
    if proc.returncode != 0 or not password:
        err = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise HaloError(f"{' '.join(argv)}: failed: {err}")
    return password


def docker_login(docker: str, host: str, password: str) -> None:
    """Hand the password to docker (never to a command line or a log): docker keeps it."""
    proc = subprocess.run(
        [docker, "login", "--username", USERNAME, "--password-stdin", host],
        input=password,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise HaloError(f"docker login {host}: failed: {err}")
