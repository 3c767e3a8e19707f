-- Read-only figures of one partition:
-- {now_ms, permits held by live holders, waiters, earliest expiry ms or -1, live holders,
--  [the partition's permits held by live holders, its waiters]}.
-- ARGV[2] (TOTAL): a partition, whose own figures follow the name's.
-- ARGV[1]: the client's now in ms for the variants that write expiries on the
-- client's clock ('' : the server's TIME). Each entry is judged by the clock
-- that wrote it: holders by that one, waiter tickets (server time) by TIME.
-- "lua" holders hold their permits (one each, plus their permits beyond the
-- first: the members of score +inf and the "+" count; those of expired
-- holders not purged yet are subtracted); the variants' holders one permit each.
-- The permits of "lua" holder `id`, from its record's tag (see tag_of).
local function permits_of_holder(id)
  return permits_of(tag_of(unpack(redis.call('HMGET', KEYS[3], id, '*' .. id))))
end
local server = server_ms()
local now = server
if ARGV[1] and ARGV[1] ~= '' then now = tonumber(ARGV[1]) end
local live = redis.call('ZCOUNT', KEYS[1], '(' .. now, '(+inf')
local used = live
local extra = redis.call('ZCOUNT', KEYS[1], '+inf', '+inf')
  + (tonumber(redis.call('HGET', KEYS[3], '+') or '') or 0)
if extra > 0 then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
    extra = extra - (permits_of_holder(id) - 1)
  end
  used = live + math.max(0, extra)
end
local waiting = redis.call('ZCOUNT', KEYS[5], '(' .. server, '+inf')
local first = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '(+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local earliest = -1
if first[2] then earliest = tonumber(first[2]) end
local out = {now, used, waiting, earliest, live}
local part = ARGV[2]
if part and part ~= '' then
  -- The partition's permits, less those of its expired holders not purged yet.
  local mine = tonumber(redis.call('HGET', KEYS[3], 'c/' .. part) or '') or 0
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
    if string.sub(id, 1, #part + 1) == part .. '/' then
      mine = mine - permits_of_holder(id)
    end
  end
  out[6] = math.max(0, mine)
  local queued = 0
  for _, member in ipairs(redis.call('ZRANGE', KEYS[4], '[' .. part .. '|', '(' .. part .. '}', 'BYLEX')) do
    local deadline = redis.call('ZSCORE', KEYS[5], member)
    if deadline and tonumber(deadline) > server then queued = queued + 1 end
  end
  out[7] = queued
end
return out
