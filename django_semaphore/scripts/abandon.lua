-- A waiter gives up: drop its ticket and pass any free permits to the next waiters.
-- ARGV: identifier, limit, total (TOTAL only). KEYS[8]: the waiter's own wake-up list.
-- A waiter that a release granted its permits (direct grant) without its
-- knowing gives them back too: it never got its lease.
-- Returns {1, [wake TTL ms, id, grant, ...]}: the waiters whose grants the
-- caller pushes (wake.lua).
local id = ARGV[1]
local now, clock = server_ms()
local total = tonumber(ARGV[3] or '')
local rec = redis.call('HMGET', KEYS[6], id, '@' .. id)
if rec[1] then
  local number, permits = string.match(rec[1], '^(%d+):(%d+):')
  if number then
    local member = number .. ':' .. permits .. ':' .. id
    -- TOTAL: "part|prio|" first (the priority is kept in the "@" field).
    local part = total and string.match(id, '^([^/]+)/')
    if part then member = part .. '|' .. string.match(rec[2] or '', '|(%d+)$') .. '|' .. member end
    redis.call('ZREM', KEYS[4], member)
    redis.call('ZREM', KEYS[5], member)
    redis.call('HDEL', KEYS[6], id, '@' .. id)
    if part then ready_update(part) end
  else
    redis.call('HDEL', KEYS[6], id, '@' .. id)
  end
end
if redis.call('ZREM', KEYS[1], id) == 1 then drop_record(id) end
redis.call('DEL', KEYS[8])
local out = {1}
if total then
  wake_total(now, clock, tonumber(ARGV[2]), total, out)
else
  wake(now, clock, tonumber(ARGV[2]), out)
end
return out
