"""The dashboard's token: nothing is shown or changed for a browser that does not present it.

Why: the page holds the client role's credentials, so whoever reaches its
port could read every container's objective and set or clear objectives
through its form. As Jupyter does, the process that starts the dashboard
makes a random token (or takes `$DQOES_DASHBOARD_TOKEN`), hands it to the
server in the environment (never on a command line, where `ps` shows it)
and prints the address with the token in it; a page opened without it
shows one line of refusal and nothing else.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping
from urllib.parse import quote

TOKEN_ENV = "DQOES_DASHBOARD_TOKEN"
TOKEN_PARAM = "token"
"""The query parameter the address carries: http://127.0.0.1:PORT/?token=..."""
TOKEN_BYTES = 24
"""Random bytes in a generated token (32 URL-safe characters)."""

REFUSAL = (
    "This dashboard needs its token: open the address that `dqoes dashboard` or `dqoes up` "
    "printed (it ends in ?token=...)."
)
NO_TOKEN_SET = (
    f"This dashboard has no token set, so it shows nothing: start it with `dqoes dashboard`, "
    f"or set ${TOKEN_ENV}."
)


def new_token() -> str:
    """A fresh random token, safe in a URL."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_from(environ: Mapping[str, str]) -> str | None:
    """The token in `environ` ($DQOES_DASHBOARD_TOKEN), None when unset or blank."""
    token = (environ.get(TOKEN_ENV) or "").strip()
    return token or None


def allowed(given: str | None, expected: str | None) -> bool:
    """Whether `given` is the token; never with no token set (the page then refuses everyone).

    Compared in constant time, so the time a refusal takes tells nothing
    about how much of a guess was right.
    """
    if not expected or not given:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def with_token(base_url: str, token: str, path: str = "/") -> str:
    """`http://HOST:PORT` + `path` with the token as its query: what a person opens."""
    return f"{base_url.rstrip('/')}{path}?{TOKEN_PARAM}={quote(token, safe='')}"
