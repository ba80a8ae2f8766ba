"""When and how long to wait before sending a request again."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

from ._wire import Response

RETRY_STATUSES = (429, 503)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter.

    Only idempotent calls are retried (GET, PUT, DELETE and the POSTs whose
    repetition is harmless, such as set_timeout); create, execute, fork,
    pause and snapshot never are, since the first attempt may have done
    its work before the failure. Retries happen on 429 and 503 answers and
    on connection failures; never after a timeout, since the server may
    still be working on the request.
    """

    max_attempts: int = 4  # 1 means no retries
    backoff_base: float = 0.25  # seconds before the first retry, at most
    backoff_max: float = 8.0
    retry_after_max: float = 30.0  # cap on a server's Retry-After

    def delay(self, attempt: int, resp: Optional[Response] = None) -> float:
        """Seconds to wait after failed attempt number attempt (1-based)."""
        if resp is not None:
            after = _retry_after(resp)
            if after is not None:
                return min(after, self.retry_after_max)
        ceiling = min(self.backoff_max, self.backoff_base * (2 ** (attempt - 1)))
        return random.uniform(0, ceiling)

    def retry_status(self, status: int) -> bool:
        return status in RETRY_STATUSES


NO_RETRIES = RetryPolicy(max_attempts=1)


def _retry_after(resp: Response) -> Optional[float]:
    value = resp.header("retry-after").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None  # absent, or an HTTP date: fall back to backoff
    return max(0.0, seconds)
