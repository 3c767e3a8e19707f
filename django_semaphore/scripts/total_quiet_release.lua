-- Give back a quiet lease's permits in a name with TOTAL: what a quiet release
-- does with plain commands for a name without it (see Lua.release), and the
-- partition's count. That count ("c/" .. part) makes this a script: only the
-- release that removes the holder's entry may lower it (a lease purged
-- meanwhile, expired or force-released, was counted out by the purge), and
-- it goes, with "s/" .. part, when its last permit does.
-- KEYS: the timeouts ZSET and the holds HASH (KEYS[1] and KEYS[3] of
-- total_release.lua), the only two this touches.
-- ARGV: identifier ("part/..."), permits (1 to MEMBERS_MAX: the holder's
-- others are members of the timeouts ZSET, as acquire_fast.lua wrote them).
-- Returns {1 if the identifier still held a live lease else 0, 1 if callers
-- may wait (the waiters flag) else 0, the server's time (ms)}: the caller
-- then serves them (serve.lua, which records the hold time too).
-- Five calls: TIME, ZSCORE, ZREM, HMGET, HDEL (one HINCRBY more while other
-- holders of the partition hold permits).
local id = ARGV[1]
local permits = tonumber(ARGV[2])
local now = server_ms()
local expiry = redis.call('ZSCORE', KEYS[1], id)
local removed
if permits > 1 then
  removed = redis.call('ZREM', KEYS[1], id, members_from(2, id, permits))
else
  removed = redis.call('ZREM', KEYS[1], id)
end
local part = string.sub(id, 1, string.find(id, '/', 1, true) - 1)
local found = redis.call('HMGET', KEYS[2], 'c/' .. part, 'w')
if removed > 0 and (tonumber(found[1] or '') or 0) <= permits then
  redis.call('HDEL', KEYS[2], id, 'c/' .. part, 's/' .. part)
else
  redis.call('HDEL', KEYS[2], id)
  if removed > 0 then redis.call('HINCRBY', KEYS[2], 'c/' .. part, -permits) end
end
return {(removed > 0 and tonumber(expiry) > now) and 1 or 0, found[2] and 1 or 0, now}
