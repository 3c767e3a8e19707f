-- A waiter gives up: drop its ticket and pass any free permits to the next waiters.
-- ARGV: identifier, limit. KEYS[8]: the waiter's own wake-up list.
-- Returns {1, [wake TTL ms, id, ...]}: the waiters whose wake-ups the caller pushes.
local id = ARGV[1]
local now = server_ms()
local rec = redis.call('HGET', KEYS[6], id)
if rec then
  local number, permits = string.match(rec, '^(%d+):(%d+):')
  if number then
    local member = number .. ':' .. permits .. ':' .. id
    redis.call('ZREM', KEYS[4], member)
    redis.call('ZREM', KEYS[5], member)
  end
  redis.call('HDEL', KEYS[6], id)
end
redis.call('DEL', KEYS[8])
local out = {1}
wake(now, tonumber(ARGV[2]), out)
return out
