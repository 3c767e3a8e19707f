-- Set a key's TTL only while it still holds the caller's value (a dispatcher
-- lock, a task run's heartbeat). KEYS[1], ARGV: value, TTL (ms). 1 if renewed.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
