"""The Lua scripts of the Redis registry: every write is one of them, atomic in Redis.

Invariants (the key layout is in :mod:`agent_reach.registry.redis.store`):

- **One clock.** A script that writes a last-seen time takes it from Redis's own ``TIME``
  (a time passed in is only ever lowered to it, never raised past it).
- **Bounded by the live ids.** ``{P}:ep:ID``, a member of ``{P}:seen`` and a field of
  ``{P}:ver`` exist together or not at all: an upsert adds all three, a removal deletes all
  three, and the removal of an id that is not registered writes nothing (it only deletes),
  but in the reset window below.
- **No re-publication undoes a change.** After Redis lost its data, each gateway puts back
  what its view holds (a re-publication: UPSERT with ``again``), which only ever inserts an
  id that Redis has nothing of, neither a record nor a tombstone: it never overwrites a
  record written since, nor brings back an id removed since. So that a removal is not
  forgotten when its id was not there to remove (a gateway writing, once Redis is back, the
  removal it buffered while Redis was away), every removal made while the epoch token is
  not the one the removing gateway last saw (it has not noticed the loss yet: Redis may also
  have been given a new token by a gateway started since) or the reset key ``{P}:reset``
  lives leaves a tombstone ``{P}:gone:ID``; each lives
  :data:`~agent_reach.registry.redis.store.RESET_WINDOW_S` from when it was set, and a
  registration deletes its id's tombstone. Both keys expire in Redis.
- **One ordered stream of versions.** Every registration and every removal takes the next
  value of the counter ``{P}:seq`` as its version, and publishes it with the change, in the
  same step: versions increase along the channel, and an id's versions increase over its
  whole history (a removed id registered again gets a version above its removal's), so no
  removal's version has to stay in Redis (the views keep theirs, :mod:`.versions`).
- **A change written late loses to a later registration.** ``{P}:ep:ID`` keeps ``at``, the
  Redis time its registration was made (0 for a re-publication: when the copy put back was
  registered is not known, and it gives way to any real change). A registration or removal
  buffered by a gateway that could not reach Redis is written with the time it was made (never
  later than Redis's ``TIME``), and not at all when the id's record was registered after that
  (through another gateway meanwhile): the later registration stands. A later *removal* leaves
  no time behind (outside the reset window, nothing at all), so a late registration of an id
  removed meanwhile is written. Records written by an older release have no ``at``: a late
  write replaces them, as before.
- **Checks and writes are one step.** The hold of token mode and the record cap are checked
  in the script that writes, so that two gateways cannot both pass a check that only one
  write may pass.
"""

from __future__ import annotations

__all__ = ["CLAIM", "INIT", "REMOVE", "RENEW", "TOUCH", "UPSERT"]

_TS = "local t = redis.call('TIME') local ts = tonumber(t[1]) + tonumber(t[2]) / 1000000 "

# The next version: the counter, but never at or below what the id had (a counter lost
# alone, or data written by an older release that counted per id).
_NEXT_VERSION = """
local ver = redis.call('INCR', KEYS[5])
local had = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
if had >= ver then ver = had + 1 redis.call('SET', KEYS[5], ver) end
"""

# KEYS: ep, seen, ver, channel, seq, gone
# ARGV: id, caps, url, desc, ts (when the registration was made; '' for now), 'GT' or '' (a
#       buffered registration written late: not written when the record there was made after
#       ts, and it never moves a newer last-seen time back), owner,
#       held seconds ('' for none: token mode's check that another live registration does not
#       hold the id), max records ('' for no cap: a NEW id is refused when seen holds as many),
#       'again' or '' (a re-publication: written only when Redis has neither the id nor its
#       tombstone)
# -> {seen, version}, or {'held', seen}, or {'full', count}, or {'skip', '0'} (a re-publication
#    or a late registration not written)
UPSERT = (
    _TS
    + """
local known = redis.call('ZSCORE', KEYS[2], ARGV[1])
if ARGV[10] == 'again' and (known or redis.call('EXISTS', KEYS[6]) == 1) then
  return {'skip', '0'}
end
if ARGV[8] ~= '' and known then
  local owner = redis.call('HGET', KEYS[1], 'owner')
  if owner and owner ~= '' and owner ~= ARGV[7] and ts - tonumber(known) < tonumber(ARGV[8]) then
    return {'held', known}
  end
end
if ARGV[9] ~= '' and not known then
  local count = redis.call('ZCARD', KEYS[2])
  if count >= tonumber(ARGV[9]) then return {'full', tostring(count)} end
end
if ARGV[5] ~= '' then ts = math.min(ts, tonumber(ARGV[5])) end
if ARGV[6] == 'GT' and known then
  local made = redis.call('HGET', KEYS[1], 'at')
  if made and tonumber(made) > ts then return {'skip', '0'} end
end
"""
    + _NEXT_VERSION
    + """
redis.call('DEL', KEYS[1], KEYS[6])
local made = ts
if ARGV[10] == 'again' then made = 0 end
redis.call('HSET', KEYS[1], 'caps', ARGV[2], 'url', ARGV[3], 'desc', ARGV[4], 'owner', ARGV[7],
  'at', string.format('%.6f', made))
if ARGV[6] == 'GT' then redis.call('ZADD', KEYS[2], 'GT', ts, ARGV[1])
else redis.call('ZADD', KEYS[2], ts, ARGV[1]) end
local seen = redis.call('ZSCORE', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ver)
redis.call('PUBLISH', KEYS[4], cjson.encode({'u', ARGV[1], ARGV[2], ARGV[3], ARGV[4], seen, ver,
  ARGV[7]}))
return {seen, ver}
"""
)

# KEYS: ep, seen, ver, channel, seq, gone, epoch, reset
# ARGV: id, the reset window in ms, when the removal was made ('' for now: a buffered removal
#       written late is not written when the record there was registered after it), the epoch
#       token the writing gateway last saw, the owner whose removal it is ('' for any: token
#       mode's endpoint token removes only its own registration, not one made since through
#       another gateway that the writer's view has not seen yet)
# -> {} when the id was not registered, or registered after a late removal (nothing published),
#    {'held'} when the record there has another owner (nothing written), else
#    {version, seen, field, value, ...}: the removal's version and the record it removed.
# In the reset window (the reset key lives, or the token is not the one the writer last saw: it
# has not noticed yet that Redis lost its data) a tombstone is left, but for a late removal not
# written.
REMOVE = (
    """
if ARGV[3] ~= '' then
  local t = redis.call('TIME')
  local removed = math.min(tonumber(ARGV[3]), tonumber(t[1]) + tonumber(t[2]) / 1000000)
  local made = redis.call('HGET', KEYS[1], 'at')
  if made and tonumber(made) > removed then return {} end
end
if ARGV[5] ~= '' then
  local owner = redis.call('HGET', KEYS[1], 'owner')
  if owner and owner ~= ARGV[5] then return {'held'} end
end
if redis.call('GET', KEYS[7]) ~= ARGV[4] or redis.call('EXISTS', KEYS[8]) == 1 then
  redis.call('SET', KEYS[6], '1', 'PX', ARGV[2])
end
local seen = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not seen then
  redis.call('DEL', KEYS[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
  return {}
end
local out = redis.call('HGETALL', KEYS[1])
"""
    + _NEXT_VERSION
    + """
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('PUBLISH', KEYS[4], cjson.encode({'r', ARGV[1], ver}))
table.insert(out, 1, seen)
table.insert(out, 1, ver)
return out
"""
)

# KEYS: seen; ARGV: ids. Only ids still registered are touched; returns the time written.
TOUCH = (
    _TS
    + """
for i = 1, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then redis.call('ZADD', KEYS[1], 'GT', ts, ARGV[i]) end
end
return string.format('%.6f', ts)
"""
)

# KEYS: seen, ver, seq. Once per prefix (when there is no counter yet): start the counter above
# every version written so far, and delete the versions of ids no longer registered (an older
# release kept one per id ever registered, or deregistered). -> how many were deleted.
INIT = """
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
local top, dropped = 0, 0
local fields = redis.call('HGETALL', KEYS[2])
for i = 1, #fields, 2 do
  top = math.max(top, tonumber(fields[i + 1]) or 0)
  if not redis.call('ZSCORE', KEYS[1], fields[i]) then
    redis.call('HDEL', KEYS[2], fields[i])
    dropped = dropped + 1
  end
end
redis.call('SET', KEYS[3], top)
return dropped
"""

# KEYS: epoch, reset; ARGV: a new token, the reset window in ms. A gateway found the epoch
# token gone or replaced (Redis lost its data): set a token unless another gateway did, and
# open (or extend) the reset window in which removals leave tombstones. -> the token Redis holds
RENEW = """
redis.call('SET', KEYS[1], ARGV[1], 'NX')
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return redis.call('GET', KEYS[1])
"""

# A claim of a ClaimMap entry (one key, its TTL Redis's own): the first claim wins, a live
# entry holding another value is never overwritten, the same value is claimed again (its TTL
# renewed). One step, so that two gateways cannot both read "free" and both write.
# KEYS: the entry; ARGV: value, TTL in ms -> the value the entry holds after the call
CLAIM = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then return held end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
"""
