-- Set a field of a HASH that lives at least a TTL (KEYS[1]): a partition with
-- parked tasks in the registry, or a run on a slot in its host's HASH.
-- ARGV: the field, its value (JSON), the TTL (ms; a longer one is kept).
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return 1
