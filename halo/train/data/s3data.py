"""s3:// datasets: read with boto3, kept in a verified cache, usable offline.

``s3://BUCKET/KEY`` is one object (JSONL or Parquet); ``s3://BUCKET/PREFIX/`` (ending in /) is
every ``.jsonl``/``.parquet`` object below it, in key order, as one source of many shards.

The cache lives under ``$HALO_DATA_ROOT/s3_datasets/md5("<bucket>/<key>")/`` (the seed's
layout): the object under its own file name, and ``halo-s3.json`` with its ETag, size and
sha256. A prefix's entry holds ``halo-s3.json`` with the listing (each shard's key, ETag and
size); each shard has its own object entry. An entry is written in a temporary folder and
renamed into place only when the bytes match the size (and the ETag, where the ETag is the
object's MD5), so an interrupted download never becomes a cache entry.

Every use asks S3 for the current ETag (one HEAD, or one listing for a prefix): a changed
object is fetched again, a current one is read from the cache after its sha256 is checked.
When S3 cannot be reached or no credentials are found, a cached copy is used and the run says
so; ``HALO_S3_OFFLINE=1`` uses the cache without asking S3 at all. A wrong credential or a
missing object is one error line naming the URL, never a credential: credentials come from
boto3's own chain (the environment, ~/.aws, an instance role) and are never read here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from halo.errors import HaloError
from halo.train.data.dataroot import data_root

OFFLINE_ENV = "HALO_S3_OFFLINE"
META = "halo-s3.json"
SHARD_SUFFIXES = (".jsonl", ".parquet")
_CHUNK = 1 << 18  # 256 KiB: written as it arrives
# Error codes that say the credentials are wrong or lack the right: authoritative, never a
# reason to fall back to the cache.
_DENIED = {
    "403",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AuthorizationHeaderMalformed",
}
_MISSING = {"404", "NoSuchKey", "NotFound"}

Say = Callable[[str], None]


def is_s3(path: object) -> bool:
    return isinstance(path, str) and path.startswith("s3://")


def parse(url: str) -> tuple[str, str]:
    bucket, _, key = url.removeprefix("s3://").partition("/")
    if not bucket or not key:
        raise HaloError(f"{url}: expected s3://BUCKET/KEY (a prefix of shards ends in /)")
    return bucket, key


def entry_name(bucket: str, key: str) -> str:
    """The cache folder of ``s3://bucket/key``: md5 of "<bucket>/<key>", as the seed keys it."""
    return hashlib.md5(f"{bucket}/{key}".encode(), usedforsecurity=False).hexdigest()


def _quiet(_: str) -> None:
    pass


def _say_on_first_rank(line: str) -> None:
    # Every process reads the data; only the first says what it did (torchrun sets RANK).
    if os.environ.get("RANK", "0") == "0":
        print(f"data: {line}", flush=True)


@dataclass(frozen=True)
class Remote:
    """What S3 says about one object now."""

    key: str
    etag: str
    size: int


class Offline(Exception):  # noqa: N818  (a condition, not a failure: the cache may answer)
    """S3 cannot be asked now (no connection, no credentials): the cache may stand in."""


class Cache:
    """The s3_datasets folder under a data root, and the client that fills it."""

    def __init__(self, root: Path | None = None, say: Say = _say_on_first_rank) -> None:
        self.dir = (root or data_root()) / "s3_datasets"
        self.say = say
        self._client: Any = None

    # --- reading ----------------------------------------------------------------------------

    def files(self, url: str, offline: bool | None = None) -> list[Path]:
        """The local files of ``url`` (one, or a prefix's shards in key order), current."""
        if offline is None:
            offline = os.environ.get(OFFLINE_ENV, "") not in ("", "0")
        bucket, key = parse(url)
        if offline:
            return self._cached(url, bucket, key, why=None)
        try:
            if key.endswith("/"):
                return self._sync_prefix(url, bucket, key)
            remote = self._head(url, bucket, key)
            return [self._sync_object(url, bucket, remote)]
        except Offline as exc:
            return self._cached(url, bucket, key, why=str(exc))

    def _cached(self, url: str, bucket: str, key: str, why: str | None) -> list[Path]:
        entry = self.dir / entry_name(bucket, key)
        meta = _read_meta(entry)
        where = f"{why}; " if why else ""
        if meta is None:
            raise HaloError(
                f"{url}: {where}no cached copy under {entry} (it is made by a run that can "
                "reach S3)"
            )
        if key.endswith("/"):
            shards = [Remote(s["key"], s["etag"], s["size"]) for s in meta.get("shards", [])]
            paths = [self._verified_copy(url, bucket, s, where) for s in shards]
        else:
            paths = [
                self._verified_copy(url, bucket, Remote(key, meta["etag"], meta["size"]), where)
            ]
        if why:
            self.say(
                f"{url}: {why}; using the cached copy ({_count(paths)}, etag "
                f"{meta.get('etag', '-')}) from {entry}"
            )
        return paths

    def _verified_copy(self, url: str, bucket: str, remote: Remote, where: str) -> Path:
        entry = self.dir / entry_name(bucket, remote.key)
        path = _current(entry, remote)
        if path is None:
            raise HaloError(
                f"s3://{bucket}/{remote.key}: {where}the cached copy under {entry} is missing or "
                "does not match its record (size, sha256)"
            )
        return path

    # --- talking to S3 ----------------------------------------------------------------------

    def client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            # Few, short retries: a machine without a network should reach the cache in
            # seconds. The endpoint (AWS_ENDPOINT_URL), region and credentials are boto3's.
            conf = Config(
                retries={"max_attempts": 2, "mode": "standard"},
                connect_timeout=10,
                read_timeout=120,
            )
            self._client = boto3.session.Session().client("s3", config=conf)
        return self._client

    def _call(self, url: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` against S3, its failures as Offline or one HaloError line."""
        from botocore import exceptions as bx

        try:
            return fn()
        except (bx.NoCredentialsError, bx.CredentialRetrievalError):
            raise Offline("no AWS credentials found") from None
        except (
            bx.EndpointConnectionError,
            bx.ConnectTimeoutError,
            bx.ReadTimeoutError,
            bx.ConnectionClosedError,
            bx.ProxyConnectionError,
        ):
            raise Offline("S3 cannot be reached") from None
        except (bx.ResponseStreamingError, bx.IncompleteReadError, ConnectionError):
            raise Offline("the connection to S3 broke off") from None
        except bx.ClientError as exc:
            raise HaloError(_client_error(url, exc.response)) from None
        except bx.BotoCoreError as exc:
            # Its message names the failure, not the credential (boto3 never echoes a secret).
            raise HaloError(f"{url}: S3 client error: {type(exc).__name__}") from None

    def _head(self, url: str, bucket: str, key: str) -> Remote:
        head = self._call(url, lambda: self.client().head_object(Bucket=bucket, Key=key))
        return Remote(key, _etag(head["ETag"]), int(head["ContentLength"]))

    def _list(self, url: str, bucket: str, prefix: str) -> list[Remote]:
        def listing() -> list[Remote]:
            out = []
            pages = self.client().get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    if obj["Key"].endswith(SHARD_SUFFIXES):
                        out.append(Remote(obj["Key"], _etag(obj["ETag"]), int(obj["Size"])))
            return sorted(out, key=lambda r: r.key)

        return self._call(url, listing)  # type: ignore[no-any-return]

    # --- filling the cache ------------------------------------------------------------------

    def _sync_prefix(self, url: str, bucket: str, prefix: str) -> list[Path]:
        shards = self._list(url, bucket, prefix)
        if not shards:
            raise HaloError(f"{url}: no {' or '.join(SHARD_SUFFIXES)} objects under this prefix")
        paths = [self._sync_object(f"s3://{bucket}/{s.key}", bucket, s, quiet=True) for s in shards]
        record = {
            "bucket": bucket,
            "key": prefix,
            "etag": hashlib.sha256(" ".join(s.etag for s in shards).encode()).hexdigest()[:16],
            "shards": [{"key": s.key, "etag": s.etag, "size": s.size} for s in shards],
        }
        entry = self.dir / entry_name(bucket, prefix)
        if _read_meta(entry) != record:
            _write_entry(entry, lambda tmp: _write_meta(tmp, record))
        self.say(f"{url}: {len(paths)} shard(s) ({_count(paths)}) current in {entry}")
        return paths

    def _sync_object(self, url: str, bucket: str, remote: Remote, quiet: bool = False) -> Path:
        entry = self.dir / entry_name(bucket, remote.key)
        path = _current(entry, remote)
        if path is not None:
            if not quiet:
                self.say(f"{url}: the cached copy is current (etag {remote.etag}) in {entry}")
            return path
        before = _read_meta(entry)
        name = Path(remote.key).name
        _write_entry(entry, lambda tmp: self._download(url, bucket, remote, tmp / name))
        what = "changed upstream, fetched again" if before else "downloaded"
        self.say(f"{url}: {what} ({remote.size} bytes, etag {remote.etag}) into {entry}")
        return entry / name

    def _download(self, url: str, bucket: str, remote: Remote, dest: Path) -> None:
        # IfMatch: the bytes are the version whose ETag was just seen, or an error; never a
        # mix of two versions under one record.
        resp = self._call(
            url,
            lambda: self.client().get_object(Bucket=bucket, Key=remote.key, IfMatch=remote.etag),
        )
        sha, md5, size = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0
        body = resp["Body"]
        with dest.open("wb") as fh:
            while chunk := self._call(url, lambda: body.read(_CHUNK)):
                fh.write(chunk)
                sha.update(chunk)
                md5.update(chunk)
                size += len(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        if size != remote.size:
            raise HaloError(f"{url}: got {size} bytes, S3 said {remote.size}; nothing cached")
        # A single-part upload's ETag is the MD5 of its bytes; a multipart one's ("...-N") is not.
        if "-" not in remote.etag and len(remote.etag) == 32 and md5.hexdigest() != remote.etag:
            raise HaloError(f"{url}: the bytes do not match the object's ETag; nothing cached")
        _write_meta(
            dest.parent,
            {
                "bucket": bucket,
                "key": remote.key,
                "file": dest.name,
                "etag": remote.etag,
                "size": size,
                "sha256": sha.hexdigest(),
            },
        )


def _client_error(url: str, response: dict[str, Any]) -> str:
    err = response.get("Error", {})
    code = str(err.get("Code") or response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    bucket, key = parse(url)
    if code in _MISSING:
        return f"{url}: no such object (key {key!r} in bucket {bucket!r})"
    if code == "NoSuchBucket":
        return f"{url}: no such bucket {bucket!r}"
    if code in _DENIED:
        return (
            f"{url}: access denied ({code}): the credentials are wrong, expired or lack "
            "s3:GetObject/s3:ListBucket (they come from AWS_* variables, AWS_PROFILE or ~/.aws)"
        )
    if code in ("412", "PreconditionFailed"):
        return f"{url}: the object changed while it was being read; run again"
    return f"{url}: S3 refused the request ({code or 'no error code'})"


def _etag(value: str) -> str:
    return value.strip('"')


def _count(paths: list[Path]) -> str:
    return f"{sum(p.stat().st_size for p in paths)} bytes"


def _read_meta(entry: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((entry / META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _write_meta(folder: Path, record: dict[str, Any]) -> None:
    (folder / META).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _current(entry: Path, remote: Remote) -> Path | None:
    """The cached file of ``remote`` if the entry records this ETag and size and the bytes
    still match its sha256; else None."""
    meta = _read_meta(entry)
    if meta is None or meta.get("etag") != remote.etag or meta.get("size") != remote.size:
        return None
    path = entry / str(meta.get("file", ""))
    try:
        if not path.is_file() or path.stat().st_size != remote.size:
            return None
        return path if _sha256(path) == meta.get("sha256") else None
    except OSError:
        return None


def _write_entry(entry: Path, fill: Callable[[Path], None]) -> None:
    """``fill`` a temporary sibling of ``entry``; rename it into place only when it is complete
    (an older entry is replaced then, not before)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".tmp", dir=entry.parent))
    try:
        fill(tmp)
        old = entry.with_name(f".{entry.name}.old-{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            entry.rename(old)
        try:
            tmp.rename(entry)
        except OSError:
            # Another process (a node sharing this folder) put its complete entry first.
            if not entry.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def local_files(url: str) -> list[tuple[str, Path]]:
    """(each object's URL, its verified local copy) of an s3:// source, in key order: what
    halo.train.data.examples reads (its errors then name the object, not the cache)."""
    bucket, _ = parse(url)
    out = []
    for path in Cache().files(url):
        meta = _read_meta(path.parent) or {}
        out.append((f"s3://{bucket}/{meta.get('key', path.name)}", path))
    return out


def prefetch(urls: list[str], say: Say | None = None) -> None:
    """Bring every URL's cache up to date (the first process of each node, before the others
    read: they then use the cache without asking S3, and all see the same bytes)."""
    cache = Cache(say=say or _say_on_first_rank)
    for url in urls:
        cache.files(url)
