"""Request-rate limits of the object stores, and the configurations that would exceed them.

Google Cloud Storage allows about one write per second to one object (more is answered
`429`, and retried); S3 allows about 3,500 writes and 5,500 reads a second per prefix, and
no per-object limit. A procedure's step keys are new objects each time, so the only object
procstore writes again and again is the lease (every `ttl / 4` seconds, with hedged retries
on a slow answer). See docs/stores.md, "Request limits".
"""

from __future__ import annotations

GCS_WRITES_PER_OBJECT_PER_SECOND = 1.0
"""Google's documented sustained rate of writes to one object."""


def lease_write_rate_warning(url: str, renew_interval: float) -> str | None:
    """What to say when renewing a lease every `renew_interval` seconds on the store at
    `url` writes one object faster than its store allows; None when it does not."""
    if not url.startswith(("gs://", "gcs://")):
        return None
    rate = 1 / renew_interval
    if rate <= GCS_WRITES_PER_OBJECT_PER_SECOND:
        return None
    least_ttl = 4 / GCS_WRITES_PER_OBJECT_PER_SECOND
    return (
        f"the lease on {url} is renewed every {renew_interval:g} s ({rate:.1f} writes/s to one object), more "
        f"than Google Cloud Storage's limit of about {GCS_WRITES_PER_OBJECT_PER_SECOND:g} write/s per object: "
        f"renewals will be throttled (429) and the lease may be lost; use Lease(ttl >= {least_ttl:g})"
    )
