"""Token mode: signing keys (:mod:`.keys`) and reach tokens (:mod:`.tokens`).

The gateway's use of them (who may do what) is in :mod:`agent_reach.gateway.access`; the
rules themselves are pure (:mod:`agent_reach.core.policy`). docs/security.md tells the whole.
"""

from agent_reach.auth.keys import KeyDirectoryError, KeyRing, generate_key
from agent_reach.auth.tokens import Claims, Kind, TokenService, TokenVerifier

__all__ = [
    "Claims",
    "KeyDirectoryError",
    "KeyRing",
    "Kind",
    "TokenService",
    "TokenVerifier",
    "generate_key",
]
