-- A waiter gives up: drop its ticket and pass any free slot to the next waiters.
-- ARGV: identifier, limit, wake prefix.
local id = ARGV[1]
local now = server_ms()
redis.call('ZREM', KEYS[4], id)
redis.call('ZREM', KEYS[5], id)
redis.call('DEL', ARGV[3] .. id)
wake(now, tonumber(ARGV[2]), ARGV[3])
return 1
