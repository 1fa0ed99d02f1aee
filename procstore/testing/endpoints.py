"""Storage options for the test servers the plugin starts on 127.0.0.1 (moto's S3, the GCS
emulator): `open_state_store(url, s3_storage_options(endpoint))`."""

from __future__ import annotations

from typing import Any


def s3_storage_options(endpoint: str) -> dict[str, Any]:
    """For `procstore_moto_endpoint` (any credentials do)."""
    return {"key": "testing", "secret": "testing", "endpoint_url": endpoint}


def gcs_storage_options(endpoint: str) -> dict[str, Any]:
    """For `procstore_gcs_endpoint` (anonymous, one project)."""
    return {"token": "anon", "endpoint_url": endpoint, "project": "test"}
