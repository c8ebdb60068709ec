"""s3:// datasets against a real local S3 server: moto in server mode, with real credentials.

Where these run: `nox -s test-s3`, natively. The CPU tier normally runs inside the image with
`docker run --network none`: no server outside the container can be reached there, and moto
is test-only, so it is in no image (pins/test-s3-server.txt locks it on its own). The session
runs this module with the locked CPU stack's Python (`halo stack install cpu`) and points
HALO_TEST_MOTO_PYTHON at a small venv holding moto; without it every test here skips, saying
so. Each test starts its own server on a random loopback port and stops it at the end.

The server checks signatures: an IAM user's key is made while anyone may act, then
/moto-api/reset-auth makes every request prove itself, so a wrong secret is refused as S3
refuses it (SignatureDoesNotMatch), not by a patched client.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import EXAMPLES, REPO, outputs, run_halo

pytestmark = pytest.mark.cpu

MOTO_ENV = "HALO_TEST_MOTO_PYTHON"
BUCKET = "halo-data"
SERVE = """
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()  # until the test closes it
server.stop()
"""
SFT = EXAMPLES / "sft" / "config.yaml"


class S3Server:
    """moto on a loopback port, with a bucket, an IAM user's key, and signatures enforced."""

    def __init__(self, python: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.proc = subprocess.Popen(
            [python, "-c", SERVE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"moto did not start (it printed {line!r})")
        self.url = f"http://127.0.0.1:{int(line)}"
        self.key_id, self.secret = self._setup()

    def client(self, service: str = "s3", secret: str | None = None) -> Any:
        import boto3

        return boto3.session.Session().client(
            service,
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id=self.key_id if secret else "setup",
            aws_secret_access_key=secret or "setup",
        )

    def _setup(self) -> tuple[str, str]:
        iam = self.client("iam")
        iam.create_user(UserName="trainer")
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}  # fmt: skip
        iam.put_user_policy(UserName="trainer", PolicyName="s3", PolicyDocument=json.dumps(policy))
        self.client().create_bucket(Bucket=BUCKET)
        req = urllib.request.Request(
            f"{self.url}/moto-api/reset-auth", data=b"0", headers={"Content-Type": "text/plain"}
        )
        urllib.request.urlopen(req, timeout=30).read()  # from here on, every request is signed
        return key["AccessKeyId"], key["SecretAccessKey"]

    def put(self, key: str, body: bytes) -> str:
        resp = self.client(secret=self.secret).put_object(Bucket=BUCKET, Key=key, Body=body)
        return str(resp["ETag"]).strip('"')

    def env(self, secret: str | None = None) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": self.key_id,
            "AWS_SECRET_ACCESS_KEY": secret or self.secret,
        }

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _moto() -> str:
    python = os.environ.get(MOTO_ENV)
    if not python or not Path(python).is_file():
        pytest.skip(
            f"no local S3 server here (${MOTO_ENV} unset): moto is test-only and the CPU tier's "
            "container has no network; `nox -s test-s3` runs these tests"
        )
    pytest.importorskip(
        "boto3", reason="the trainer's stack carries boto3 (pins/requirements/trainer.in)"
    )
    return python


@pytest.fixture(scope="module")
def shared_server() -> Iterator[S3Server]:
    """One server for the tests that keep it running (each uses keys of its own)."""
    server = S3Server(_moto())
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Nothing of the machine's own AWS set-up may take part: only what each test gives.
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("HALO_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.delenv("HALO_S3_OFFLINE", raising=False)


@pytest.fixture
def s3(shared_server: S3Server, clean_env: None) -> S3Server:
    return shared_server


@pytest.fixture
def own_s3(clean_env: None) -> Iterator[S3Server]:
    """A server of this test's own: it stops it midway."""
    server = S3Server(_moto())
    try:
        yield server
    finally:
        server.stop()


def _use(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def _entries(root: Path) -> list[str]:
    folder = root / "s3_datasets"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _files_holding(root: Path, needle: str) -> list[str]:
    data = needle.encode()
    return [str(p) for p in root.rglob("*") if p.is_file() and data in p.read_bytes()]


# --- the acceptance: halo launch on s3://, then again with the server stopped -----------------


def test_launch_trains_from_s3_then_from_the_cache_with_the_server_stopped(
    own_s3: S3Server, tmp_path: Path
) -> None:
    s3 = own_s3
    s3.put("sft/train.jsonl", (EXAMPLES / "sft" / "train.jsonl").read_bytes())
    hf_token, api_key = f"hf_{secrets.token_hex(12)}", secrets.token_hex(12)
    secret_values = [s3.secret, hf_token, api_key]
    common = [
        "--data.train=s3://halo-data/sft/train.jsonl",
        "--training.max_steps=2",
        "--checkpoint.every_steps=0",
        # Secrets on the command line: every echo of it must hide them.
        f"--runtime.env.HF_TOKEN={hf_token}",
        f"--runtime.rollout_url=http://trainer:{api_key}@127.0.0.1:9/v1?api_key={api_key}",
    ]
    env = {**s3.env(), "HALO_DATA_ROOT": str(tmp_path / "data"), "WANDB_MODE": "offline"}
    env |= {"WANDB_CONFIG_DIR": str(tmp_path / "wandb-home"), "WANDB_CACHE_DIR": str(tmp_path / "wandb-home")}  # fmt: skip
    first = run_halo(
        "launch", "sft", str(SFT), "--", *common, *outputs(tmp_path / "one"),
        "--runtime.report_to=[wandb, tensorboard]", **env,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    assert "data: s3://halo-data/sft/train.jsonl: downloaded" in first.stdout
    assert "HF_TOKEN=***" in first.stderr and "api_key=***" in first.stderr  # the echoed command

    s3.stop()
    again = run_halo("launch", "sft", str(SFT), "--", *common, *outputs(tmp_path / "two"), **env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "S3 cannot be reached; using the cached copy" in again.stdout
    rows = [json.loads(x) for x in (tmp_path / "two/logs/tiny-sft/metrics.jsonl").read_text().splitlines()]  # fmt: skip
    assert [r["step"] for r in rows] == [1, 2]

    from halo.cli import main

    png = tmp_path / "two" / "metrics.png"
    assert main(["plot", str(tmp_path / "two/logs/tiny-sft"), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # No secret in any output, log, metrics file, tracker file, cache or checkpoint.
    assert list((tmp_path / "one/logs/tiny-sft/wandb").glob("offline-run-*/run-*.wandb"))
    for value in secret_values:
        for proc in (first, again):
            assert value not in proc.stdout and value not in proc.stderr
        assert _files_holding(tmp_path, value) == []


# --- the cache: a changed object, a partial download, a prefix of shards ----------------------


def test_an_object_changed_upstream_is_fetched_again(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from halo.train.data import s3data

    _use(monkeypatch, s3.env())
    said: list[str] = []
    cache = s3data.Cache(tmp_path / "data", say=said.append)
    url = f"s3://{BUCKET}/a/train.jsonl"
    first = s3.put("a/train.jsonl", b'{"prompt": "1", "completion": "2"}\n')
    (path,) = cache.files(url)
    assert said[-1].startswith(f"{url}: downloaded") and first in said[-1]
    assert path.read_bytes() == b'{"prompt": "1", "completion": "2"}\n'
    (path,) = cache.files(url)
    assert said[-1].startswith(f"{url}: the cached copy is current")

    second = s3.put("a/train.jsonl", b'{"prompt": "3", "completion": "4"}\n')
    assert second != first
    (path,) = cache.files(url)
    assert said[-1].startswith(f"{url}: changed upstream, fetched again") and second in said[-1]
    assert path.read_bytes() == b'{"prompt": "3", "completion": "4"}\n'
    assert _entries(tmp_path / "data") == [s3data.entry_name(BUCKET, "a/train.jsonl")]

    # A cached copy whose bytes changed on disk is not trusted: fetched again.
    path.write_bytes(b'{"prompt": "x", "completion": "y"}\n')
    (path,) = cache.files(url)
    assert said[-1].startswith(f"{url}: changed upstream, fetched again")
    assert path.read_bytes() == b'{"prompt": "3", "completion": "4"}\n'


def test_a_prefix_of_shards_is_one_source_in_key_order_and_works_offline(
    own_s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = own_s3
    import pyarrow as pa
    import pyarrow.parquet as pq

    from halo.train.data import examples, s3data

    _use(monkeypatch, s3.env())
    parquet = tmp_path / "b.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "p2", "completion": "c2"}]), parquet)
    s3.put("shards/b.parquet", parquet.read_bytes())
    s3.put("shards/a.jsonl", b'{"prompt": "p1", "completion": "c1"}\n')
    s3.put("shards/_SUCCESS", b"")
    rows = examples.read_rows(f"s3://{BUCKET}/shards/")
    assert [r.data["prompt"] for r in rows] == ["p1", "p2"]
    assert rows[0].where == f"s3://{BUCKET}/shards/a.jsonl:1"
    s3.stop()
    said: list[str] = []
    paths = s3data.Cache(tmp_path / "data", say=said.append).files(f"s3://{BUCKET}/shards/")
    assert [p.name for p in paths] == ["a.jsonl", "b.parquet"]
    assert "S3 cannot be reached; using the cached copy" in said[-1]


def test_a_partial_download_never_becomes_a_cache_entry(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from halo.errors import HaloError
    from halo.train.data import s3data

    body = b"".join(b'{"prompt": "%d", "completion": "%d"}\n' % (i, i) for i in range(4000))
    s3.put("big/train.jsonl", body)
    with _cutting_proxy(s3.url, budget=8000) as proxy:
        _use(monkeypatch, {**s3.env(), "AWS_ENDPOINT_URL": proxy})
        with pytest.raises(HaloError, match=r"broke off; no cached copy"):
            s3data.Cache(tmp_path / "data", say=lambda _: None).files(f"s3://{BUCKET}/big/train.jsonl")  # fmt: skip
    assert _entries(tmp_path / "data") == []  # no entry, no temporary folder left behind


def test_a_download_killed_midway_leaves_no_cache_entry(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies (SIGKILL: no handler runs) while the bytes arrive: what it wrote is a
    hidden temporary folder, never the entry, and the next run downloads the object whole."""
    import sys
    import time

    from halo.train.data import s3data

    # Larger than the reader's 256 KiB chunk: the first chunk lands, then the network stalls.
    body = b"".join(b'{"prompt": "%d", "completion": "%d"}\n' % (i, i) for i in range(20000))
    s3.put("killed/train.jsonl", body)
    url = f"s3://{BUCKET}/killed/train.jsonl"
    root = tmp_path / "data"
    code = (
        "from pathlib import Path; from halo.train.data import s3data; "
        f"s3data.Cache(Path({str(root)!r})).files({url!r})"
    )
    with _cutting_proxy(s3.url, budget=len(body) // 2, stall=True) as proxy:
        env = {**os.environ, **s3.env(), "AWS_ENDPOINT_URL": proxy, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO)
        try:
            deadline = time.monotonic() + 120
            while not [p for p in root.glob("s3_datasets/.*.tmp/*") if p.stat().st_size > 0]:
                assert proc.poll() is None and time.monotonic() < deadline, "no download began"
                time.sleep(0.05)
        finally:
            proc.kill()
            proc.wait()
    entry = s3data.entry_name(BUCKET, "killed/train.jsonl")
    assert [e for e in _entries(root) if not e.startswith(".")] == []
    _use(monkeypatch, s3.env())
    said: list[str] = []
    (path,) = s3data.Cache(root, say=said.append).files(url)
    assert said[-1].startswith(f"{url}: downloaded") and path.parent.name == entry
    assert path.read_bytes() == body


@contextlib.contextmanager
def _cutting_proxy(upstream: str, budget: int, stall: bool = False) -> Iterator[str]:
    """A TCP relay to ``upstream`` that closes each connection after ``budget`` bytes of
    response (or, with ``stall``, stops relaying and holds it open): a network that breaks
    mid-download, with the server's real responses."""
    host, port = upstream.removeprefix("http://").split(":")
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def relay(client: socket.socket) -> None:
        server = socket.create_connection((host, int(port)))
        sent = 0

        def upward() -> None:
            with contextlib.suppress(OSError):
                while data := client.recv(65536):
                    server.sendall(data)

        threading.Thread(target=upward, daemon=True).start()
        with contextlib.suppress(OSError):
            while sent < budget and (data := server.recv(65536)):
                data = data[: budget - sent]
                client.sendall(data)
                sent += len(data)
        if stall:
            stop.wait()
        for s in (client, server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=relay, args=(client,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


# --- bad credentials and missing objects: one line, exit 2, no secret ---------------------------


def _dry_run(url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> tuple[int, str, str]:
    from halo.cli import main

    rc = main(["launch", "sft", str(SFT), "--dry-run", "--", f"--data.train={url}", *outputs(tmp_path)])  # fmt: skip
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_wrong_credential_is_one_line_and_exit_2(
    s3: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    s3.put("sft/train.jsonl", (EXAMPLES / "sft" / "train.jsonl").read_bytes())
    wrong = secrets.token_hex(20)
    _use(monkeypatch, s3.env(secret=wrong))
    rc, out, err = _dry_run(f"s3://{BUCKET}/sft/train.jsonl", capsys, tmp_path)
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith(
        "halo: error: s3://halo-data/sft/train.jsonl: access denied"
    )
    for text in (out, err):
        assert wrong not in text and s3.secret not in text
    assert _entries(tmp_path / "data") == []


def test_a_missing_key_is_one_line_naming_the_key_never_the_secret(
    s3: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _use(monkeypatch, s3.env())
    rc, out, err = _dry_run(f"s3://{BUCKET}/sft/missing.jsonl", capsys, tmp_path)
    assert rc == 2
    assert err == (
        "halo: error: s3://halo-data/sft/missing.jsonl: no such object (key 'sft/missing.jsonl' "
        "in bucket 'halo-data')\n"
    )
    assert s3.secret not in out + err


def test_without_credentials_and_without_a_cache_the_run_says_what_is_missing(
    s3: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.url)
    rc, _, err = _dry_run(f"s3://{BUCKET}/sft/train.jsonl", capsys, tmp_path)
    assert rc == 2
    assert err.startswith(
        "halo: error: s3://halo-data/sft/train.jsonl: no AWS credentials found; no cached copy"
    )


def test_the_data_root_defaults_to_the_seeds_cache_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    from halo.train.data.dataroot import data_root

    monkeypatch.delenv("HALO_DATA_ROOT", raising=False)
    monkeypatch.setenv("HOME", "/home/someone")
    assert data_root() == Path("/home/someone/.cache/halo")
    monkeypatch.setenv("HALO_DATA_ROOT", "/scratch/halo")
    assert data_root() == Path("/scratch/halo")
