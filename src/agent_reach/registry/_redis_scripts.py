"""The Lua scripts of the Redis registry (:mod:`agent_reach.registry.redis`).

Each runs atomically in Redis and takes its time from Redis's own ``TIME``, so every gateway
derives statuses from one clock. The key layout is in the registry module's docstring.
"""

from __future__ import annotations

__all__ = ["REMOVE", "TOUCH", "UPSERT"]

_TS = "local t = redis.call('TIME') local ts = tonumber(t[1]) + tonumber(t[2]) / 1000000 "

# KEYS: ep, seen, ver, channel; ARGV: id, caps, url, desc, ts ('' for now), 'GT' or '', owner,
# held seconds ('' for none: token mode's check that the id is not held by another live
# registration, made here so that it and the write are one step)
# (a time ahead of Redis's own, from a measurement error, is cut to Redis's)
UPSERT = (
    _TS
    + """
if ARGV[8] ~= '' then
  local owner = redis.call('HGET', KEYS[1], 'owner')
  if owner and owner ~= '' and owner ~= ARGV[7] then
    local held = redis.call('ZSCORE', KEYS[2], ARGV[1])
    if held and ts - tonumber(held) < tonumber(ARGV[8]) then return {'held', held} end
  end
end
if ARGV[5] ~= '' then ts = math.min(ts, tonumber(ARGV[5])) end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'caps', ARGV[2], 'url', ARGV[3], 'desc', ARGV[4], 'owner', ARGV[7])
if ARGV[6] == 'GT' then redis.call('ZADD', KEYS[2], 'GT', ts, ARGV[1])
else redis.call('ZADD', KEYS[2], ts, ARGV[1]) end
local seen = redis.call('ZSCORE', KEYS[2], ARGV[1])
local ver = redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
local event = {'u', ARGV[1], ARGV[2], ARGV[3], ARGV[4], seen, ver, ARGV[7]}
redis.call('PUBLISH', KEYS[4], cjson.encode(event))
return {seen, ver}
"""
)
# KEYS: ep, seen, ver, channel; ARGV: id
# (the version is bumped, never deleted: a removal outranks the registrations before it)
REMOVE = """
local n = redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[1])
local ver = redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
if n > 0 then redis.call('PUBLISH', KEYS[4], cjson.encode({'r', ARGV[1], ver})) end
return ver
"""
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
