-- Note a partition with parked tasks in the registry HASH (KEYS[1]).
-- ARGV: the partition's keys' base, what rebuilds its semaphore (JSON), TTL (ms).
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return 1
