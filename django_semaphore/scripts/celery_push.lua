-- Park a task message: push it on a partition's LIST of parked tasks.
-- KEYS[1] the LIST. ARGV: 'RPUSH' (at the back) or 'LPUSH' (first in line),
-- the message, the TTL (ms). A TTL is only ever lengthened (a semaphore with a
-- longer TIMEOUT may rely on it). Returns the number of tasks parked there.
redis.call(ARGV[1], KEYS[1], ARGV[2])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return redis.call('LLEN', KEYS[1])
