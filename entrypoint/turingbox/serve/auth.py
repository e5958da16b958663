"""The sidecar's API key (setting api_key): a bearer token compared in constant time."""
from __future__ import annotations

import hmac

NEED_KEY = "A valid API key is required: send 'Authorization: Bearer <key>'."


def key_ok(api_key: str | None, authorization: str | None) -> bool:
    """Whether an Authorization header carries the key (always, when no key is set)."""
    if not api_key:
        return True
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        token = ""
    # Constant time whatever the token's content.
    return hmac.compare_digest(token.strip().encode("utf-8", "replace"), api_key.encode("utf-8"))
