-- Take over a key that still holds the value the caller saw (a dead process's
-- dispatcher lock). KEYS[1], ARGV: the value seen, the new value, TTL (ms).
-- 1 if taken over.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
