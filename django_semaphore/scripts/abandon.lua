-- A waiter gives up: drop its ticket and pass any free slot to the next waiters.
-- ARGV: identifier, limit. KEYS[7]: the waiter's own wake-up list.
-- Returns {1, [wake TTL ms, id, ...]}: the waiters whose wake-ups the caller pushes.
local id = ARGV[1]
local now = server_ms()
redis.call('ZREM', KEYS[4], id)
redis.call('ZREM', KEYS[5], id)
redis.call('HDEL', KEYS[6], id)
redis.call('DEL', KEYS[7])
local out = {1}
wake(now, tonumber(ARGV[2]), out)
return out
