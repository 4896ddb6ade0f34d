"""Token mode's files: the key directory and the policy file, loaded at start and reloaded.

Invariants:
- At start, a key directory or policy file that cannot be used stops the gateway (ValueError
  with the reason, and the policy's line at fault).
- Afterwards a change is picked up by :meth:`AuthFiles.reload` (polled, or ``POST
  /v1/reload``); a bad file is refused (``auth.reload_failed``, and InvalidRequest naming the
  line) and what is in force stays.
- Issuing a token (``POST /v1/tokens``) checks its patterns before anything is signed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_reach.auth.keys import KeyDirectoryError, KeyRing
from agent_reach.auth.tokens import Kind, TokenService
from agent_reach.core.names import is_endpoint_id
from agent_reach.core.policy import Policy, PolicyFileError, compile_pattern, parse_policy
from agent_reach.errors import InvalidRequest
from agent_reach.observability.logs import log
from agent_reach.wire.bodies import DEFAULT_CLIENT_TTL_S, DEFAULT_ENROLL_TTL_S, TokenRequest

__all__ = ["AuthFiles", "IssuedToken"]

IssuedToken = tuple[Kind, str, str, float, float]  # kind, subject, token, expires_at, ttl_s


class AuthFiles:
    """The signing keys of ``keys_dir`` (and the tokens they make) and the policy file."""

    def __init__(
        self, keys_dir: str, policy_path: str, *, wall: Callable[[], float] = time.time
    ) -> None:
        self.keys = KeyRing(keys_dir)
        self.tokens = TokenService(self.keys, wall=wall)
        self.policy_path = Path(policy_path)
        self.policy = Policy.empty()
        self.wall = wall
        self._policy_stamp: tuple[int, int] | None = None

    def load(self) -> None:
        """First load of keys and policy; a ConfigError (KeyDirectoryError, or PolicyFileError
        naming the line at fault) when either cannot be used: the gateway does not start."""
        self.keys.load()
        self._load_policy()
        log(
            logging.INFO,
            "auth.token_mode",
            keys=len(self.keys.keys),
            signing_kid=self.keys.signing_key(self.wall()).kid,
            policy_file=str(self.policy_path),
            policy=self.policy.summary(),
        )

    def _load_policy(self) -> bool:
        """Read the policy file when it changed; PolicyFileError (old policy kept) when bad."""
        path = self.policy_path
        try:
            st = path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._policy_stamp:
                return False
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeError) as exc:
            raise PolicyFileError(f"cannot read it: {exc}", line=None, source=str(path)) from None
        policy = parse_policy(text, source=str(path))
        self.policy, self._policy_stamp = policy, stamp
        return True

    def reload(self) -> dict[str, Any]:
        """Re-read the keys and the policy where they changed. A bad file is refused (logged
        ``auth.reload_failed`` and raised as InvalidRequest naming the line at fault) and the
        one in force stays."""
        try:
            keys_changed = self.keys.load()
        except KeyDirectoryError as exc:
            log(logging.ERROR, "auth.reload_failed", what="keys", error=str(exc))
            raise InvalidRequest(f"keys not reloaded, the old ones stay: {exc}") from None
        try:
            policy_changed = self._load_policy()
        except PolicyFileError as exc:
            log(logging.ERROR, "auth.reload_failed", what="policy", error=str(exc), line=exc.line)
            refused = InvalidRequest(f"policy not reloaded, the old one stays: {exc}")
            refused.fields["line"] = exc.line
            raise refused from None
        if keys_changed or policy_changed:
            log(
                logging.INFO,
                "auth.reloaded",
                keys=len(self.keys.keys),
                keys_changed=keys_changed,
                policy_changed=policy_changed,
                policy=self.policy.summary(),
            )
        return {
            "ok": True,
            "mode": "tokens",
            "keys": len(self.keys.keys),
            "signing_kid": self.keys.signing_key(self.wall()).kid if self.keys.keys else None,
            "keys_changed": keys_changed,
            "policy_changed": policy_changed,
            "policy": self.policy.summary(),
        }

    def issue(self, request: TokenRequest) -> IssuedToken:
        """A new enrollment or client token for ``POST /v1/tokens`` (InvalidRequest when the
        request cannot be one)."""
        try:
            for pattern in request.endpoints:
                compile_pattern(pattern, "endpoint")
            for pattern in request.intents:
                compile_pattern(pattern, "intent")
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        kind = Kind(request.kind)
        if kind is Kind.ENROLL:
            if not request.endpoints or not request.intents:
                raise InvalidRequest(
                    "an enrollment token needs 'endpoints' and 'intents' (patterns)"
                )
            subject = request.subject or "enroll"
            ttl = request.ttl_s or DEFAULT_ENROLL_TTL_S
        else:
            if request.subject is None or not is_endpoint_id(request.subject):
                raise InvalidRequest(
                    "a client token needs 'subject': the agent://name id it sends as",
                    field="subject",
                )
            if request.endpoints or request.intents:
                raise InvalidRequest(
                    "a client token takes no 'endpoints' or 'intents': what it may reach is"
                    " the policy's [[reach]] rules"
                )
            subject = request.subject
            ttl = request.ttl_s or DEFAULT_CLIENT_TTL_S
        token, expires = self.tokens.issue(
            kind, subject, ttl, endpoints=request.endpoints, intents=request.intents
        )
        return kind, subject, token, expires, ttl
