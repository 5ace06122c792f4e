"""Store locations: local directories and `s3://` URIs, configured from the environment.

Why the environment and nothing else: credentials must never land in a flow
file, a resolved config, a log line or an error message. Components read the
standard AWS variables (the same ones boto3, the AWS CLI, SkyPilot and Modal
secrets set), and every message that could carry one goes through `redact`.

    AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN   credentials
    AWS_REGION (or AWS_DEFAULT_REGION)                              region
    AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3)                       S3-compatible
        endpoint: MinIO, R2, GCS interop, a local test server

`gs://` is not supported directly: point AWS_ENDPOINT_URL at
https://storage.googleapis.com with HMAC keys and use `s3://` instead.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

#: Secret variables; any variable *ending* in one is redacted too, because a weight
#: replica on another endpoint reads `<prefix>AWS_*` (`store.replicas[].credentials_env`).
SECRET_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


class StoreURIError(ValueError):
    """A store location this build cannot use."""


def is_remote(uri: str | Path) -> bool:
    return "://" in str(uri) and not str(uri).startswith("file://")


def local_path(uri: str | Path) -> Path:
    s = str(uri)
    return Path(s[len("file://"):] if s.startswith("file://") else s)


def check_uri(uri: str | Path) -> None:
    if not is_remote(uri):
        return
    scheme = urlparse(str(uri)).scheme
    if scheme != "s3":
        raise StoreURIError(
            f"store URI scheme {scheme!r} is not supported (use a local path or s3://bucket/prefix; "
            f"for GCS set AWS_ENDPOINT_URL=https://storage.googleapis.com with HMAC keys)"
        )
    if not urlparse(str(uri)).netloc:
        raise StoreURIError(f"store URI {uri!r} names no bucket (expected s3://bucket/prefix)")


@dataclass(frozen=True)
class S3Settings:
    endpoint: str | None
    region: str | None
    access_key: str | None
    secret_key: str | None
    session_token: str | None

    @classmethod
    def from_env(cls, prefix: str = "", *, endpoint: str | None = None) -> S3Settings:
        """Settings from `<prefix>AWS_*` variables; `endpoint` (from a flow's replica
        spec, never secret) overrides the endpoint variable."""
        env = os.environ

        def get(*names: str) -> str | None:
            return next((env[prefix + n] for n in names if env.get(prefix + n)), None)

        return cls(
            endpoint=endpoint or get("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
            region=get("AWS_REGION", "AWS_DEFAULT_REGION"),
            access_key=get("AWS_ACCESS_KEY_ID"),
            secret_key=get("AWS_SECRET_ACCESS_KEY"),
            session_token=get("AWS_SESSION_TOKEN"),
        )

    @property
    def key(self) -> str:
        """What tells two stores with the same bucket name apart (cache folders)."""
        return self.endpoint or ""

    def __repr__(self) -> str:  # never print the keys, even by accident
        return f"S3Settings(endpoint={self.endpoint!r}, region={self.region!r}, keys=<redacted>)"

    __str__ = __repr__


def lance_storage_options(uri: str | Path, timeout_s: float = 5.0) -> dict[str, str] | None:
    """Storage options for LanceDB on `uri` (None for local paths).

    Short client timeouts make an unreachable store fail fast into our own
    retry loop, which has a bounded budget and names the store in its error.
    """
    if not is_remote(uri):
        return None
    check_uri(uri)
    s = S3Settings.from_env()
    # Measured against a stopped S3 server: per-request timeouts make a call fail
    # sooner but lance retries at several levels, so our retry budget (not these)
    # is what bounds an outage. client_retry_timeout takes plain seconds.
    opts: dict[str, str] = {"timeout": f"{int(timeout_s)}s", "connect_timeout": "2s",
                            "client_max_retries": "2", "client_retry_timeout": "10"}
    if s.endpoint:
        opts["aws_endpoint"] = s.endpoint
        if s.endpoint.startswith("http://"):
            opts["allow_http"] = "true"
    if s.region:
        opts["aws_region"] = s.region
    if s.access_key:
        opts["aws_access_key_id"] = s.access_key
    if s.secret_key:
        opts["aws_secret_access_key"] = s.secret_key
    if s.session_token:
        opts["aws_session_token"] = s.session_token
    return opts


def arrow_filesystem(uri: str | Path, timeout_s: float = 10.0,
                     settings: S3Settings | None = None) -> tuple[Any, str]:
    """A pyarrow filesystem and the path inside it for `uri` (`settings`: default
    from the environment's AWS_* variables)."""
    import pyarrow.fs as pafs

    if not is_remote(uri):
        path = local_path(uri).resolve()
        return pafs.LocalFileSystem(), path.as_posix()
    check_uri(uri)
    s = settings or S3Settings.from_env()
    kwargs: dict[str, Any] = {
        "region": s.region or "us-east-1",
        "connect_timeout": 2.0,
        "request_timeout": timeout_s,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=2),
        # One PutObject per file: atomic, and it avoids multipart completion,
        # which some S3-compatible servers (moto 5.2) answer in a form Arrow rejects.
        "allow_delayed_open": True,
    }
    if s.access_key and s.secret_key:
        kwargs.update(access_key=s.access_key, secret_key=s.secret_key,
                      session_token=s.session_token)
    if s.endpoint:
        parsed = urlparse(s.endpoint)
        kwargs["endpoint_override"] = parsed.netloc or parsed.path
        kwargs["scheme"] = parsed.scheme or "https"
    parsed = urlparse(str(uri))
    return pafs.S3FileSystem(**kwargs), f"{parsed.netloc}{parsed.path}".rstrip("/")


def redact(text: object) -> str:
    """`text` with every credential from the environment replaced by `***`.

    Applied to every store error and retry warning we emit: client libraries
    sometimes echo request details, and a leaked key in a log is a leaked key.
    """
    out = str(text)
    for var, val in os.environ.items():
        if var.endswith(SECRET_VARS) and val and len(val) >= 4:
            out = out.replace(val, "***")
    # Signed URLs and auth headers carry derived secrets; drop their values too.
    out = re.sub(r"(X-Amz-(?:Signature|Credential|Security-Token)=)[^&\s]+", r"\1***", out)
    return re.sub(r"(Authorization:?\s*)\S+(\s+\S+)?", r"\1***", out)
