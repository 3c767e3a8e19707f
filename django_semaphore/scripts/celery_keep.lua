-- Keep a key of parked tasks (a partition's LIST, or the registry HASH) while a
-- dispatcher serves it: its TTL is lengthened to ARGV[1] (ms), never shortened.
-- KEYS[1] the key. Returns 1 if lengthened, 0 if not (or the key is gone).
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 or ttl >= tonumber(ARGV[1]) then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
