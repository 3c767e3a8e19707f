-- Shared prelude, prepended to every script.
-- KEYS[1] timeouts ZSET (id -> expiry ms), KEYS[2] owners ZSET (id -> token),
-- KEYS[3] holds HASH (id -> "token:acquired_ms:meta", "#" -> counter),
-- KEYS[4] queue ZSET (waiter id -> ticket), KEYS[5] queue deadlines ZSET (waiter id -> ms).
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end

-- Remove up to `n` holders whose lease ended at or before `now`; return how many.
local function purge_holders(now, n)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, n)
  if #gone > 0 then
    redis.call('ZREM', KEYS[1], unpack(gone))
    redis.call('ZREM', KEYS[2], unpack(gone))
    redis.call('HDEL', KEYS[3], unpack(gone))
  end
  return #gone
end

-- Remove abandoned waiter tickets; return the number of waiters left.
local function purge_waiters(now)
  local waiting = redis.call('ZCARD', KEYS[4])
  if waiting > 0 then
    local gone = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, 100)
    if #gone > 0 then
      redis.call('ZREM', KEYS[4], unpack(gone))
      redis.call('ZREM', KEYS[5], unpack(gone))
      waiting = redis.call('ZCARD', KEYS[4])
    end
  end
  return waiting
end

-- Push a wake-up to the first waiters, one per free slot.
local function wake(now, limit, wake_prefix)
  local waiting = purge_waiters(now)
  if waiting == 0 then return end
  local free = limit - redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
  if free <= 0 then return end
  for _, w in ipairs(redis.call('ZRANGE', KEYS[4], 0, free - 1)) do
    local k = wake_prefix .. w
    redis.call('RPUSH', k, '1')
    redis.call('PEXPIRE', k, 10000)
  end
end

-- Keep the holder keys alive past the latest expiry they hold, plus one second.
-- Every writer gives the three keys the same TTL, with one lease to spare
-- (so a partition nobody uses is gone within 2 x lease + 1 s): while the
-- timeout ZSET's TTL still covers this expiry the others' do too, and one
-- PTTL replaces four commands.  `force` when a key may have been (re)created.
local function keep_alive(now, expiry, lease, force)
  local need = expiry - now + 1000
  if not force and redis.call('PTTL', KEYS[1]) >= need then return end
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] and tonumber(last[2]) > expiry then need = tonumber(last[2]) - now + 1000 end
  local ttl = need + lease
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
end
