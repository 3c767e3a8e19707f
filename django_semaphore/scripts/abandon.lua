-- A waiter gives up: drop its ticket and pass any free permits to the next waiters.
-- ARGV: identifier, limit. KEYS[8]: the waiter's own wake-up list.
-- A waiter that a release granted its permits (direct grant) without its
-- knowing gives them back too: it never got its lease.
-- Returns {1, [wake TTL ms, id, grant, ...]}: the waiters whose grants the
-- caller pushes (wake.lua).
local id = ARGV[1]
local now, clock = server_ms()
local rec = redis.call('HGET', KEYS[6], id)
if rec then
  local number, permits = string.match(rec, '^(%d+):(%d+):')
  if number then
    local member = number .. ':' .. permits .. ':' .. id
    redis.call('ZREM', KEYS[4], member)
    redis.call('ZREM', KEYS[5], member)
  end
  redis.call('HDEL', KEYS[6], id, '@' .. id)
end
if redis.call('ZREM', KEYS[1], id) == 1 then drop_record(id) end
redis.call('DEL', KEYS[8])
local out = {1}
wake(now, clock, tonumber(ARGV[2]), out)
return out
