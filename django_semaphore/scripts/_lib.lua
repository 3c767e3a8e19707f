-- Shared prelude, prepended to every script.
-- KEYS[1] timeouts ZSET (id -> expiry ms), KEYS[2] owners ZSET (id -> token),
-- KEYS[3] holds HASH (id -> "token:acquired_ms:meta", "@" .. id -> the
--         holder's slot numbers "3,5" ("lua"), "#" -> counter,
--         "%" -> recent hold times, see record_hold),
-- KEYS[4] queue ZSET (member "ticket:permits:id" -> -priority: ZRANGE is the
--         serving order, priority first, then the ticket number: members of
--         one score sort as strings, and ticket numbers all have the same
--         number of digits (server microseconds: 16 until the year 2286)),
-- KEYS[5] queue deadlines ZSET (the same members -> ms),
-- KEYS[6] waiters HASH (waiter id -> "ticket:permits:meta json", while it is queued),
-- KEYS[7] slots bitmap (bit n set while a holder has slot n: BITCOUNT is the
--         number of permits held, BITPOS finds free slots in O(LIMIT / 64)),
-- KEYS[8] (acquire of a waiter, abandon) the caller's own wake-up LIST.
-- A script touches no other key: the wake-up lists of other waiters are
-- pushed afterwards by wake.lua, to which the caller passes the identifiers
-- (and the TTL) a script returned (Redis Cluster wants every key declared).
--
-- A TTL that a holder or waiter relies on is only ever lengthened: processes
-- may disagree on TIMEOUT (a rolling deploy that changes it), and a
-- short-TIMEOUT process must not cut the TTL of a longer one's keys. A key
-- that may have been (re)created always gets a TTL in the same script.

-- A woken waiter has this long to come back and take its slot: a live one
-- does within milliseconds; a dead one is then dropped from the queue instead
-- of holding up the waiters behind it until its ticket runs out.
local CLAIM_MS = 500
-- Recent hold times, packed in one integer field of the holds HASH so that a
-- release records one with a single HINCRBY: sum of the holds in ms x SCALE +
-- their number. Both halve when the number reaches SAMPLES (older holds weigh
-- less and less), which keeps the number below SCALE and the sum exact.
local HOLDS_FIELD = '%'
local HOLD_SCALE = 1024
local HOLD_SAMPLES = 32
local HOLD_MAX_MS = 2147483647  -- longer holds count as this: 32 x 2^31 x 1024 < 2^53

local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end

-- Give `key` a TTL of at least `ttl` ms; never shorten a longer one, and set
-- one on a key that has none (PTTL -1: just created).
local function lengthen(key, ttl)
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
end

-- Give the slots "3,5" back to the bitmap, which exists.
local function free_slots(slots)
  for pos in string.gmatch(slots, '%d+') do redis.call('SETBIT', KEYS[7], pos, 0) end
end

-- Forget the records of the holders `ids` (at most 1000): their slots go back
-- to the bitmap (if it still exists: SETBIT would create it without a TTL).
-- Returns how many holder records there were.
local function drop_records(ids)
  local fields = {}
  for i, id in ipairs(ids) do fields[i] = '@' .. id end
  local slots = redis.call('HMGET', KEYS[3], unpack(fields))
  local exists = nil
  for i = 1, #ids do
    if slots[i] then
      if exists == nil then exists = redis.call('EXISTS', KEYS[7]) == 1 end
      if exists then free_slots(slots[i]) end
    end
  end
  redis.call('HDEL', KEYS[3], unpack(fields))
  return redis.call('HDEL', KEYS[3], unpack(ids))
end

-- drop_records for one holder, `id` (release, refresh): returns how many of
-- its two fields were there.
local function drop_record(id)
  local slots = redis.call('HGET', KEYS[3], '@' .. id)
  if slots and redis.call('EXISTS', KEYS[7]) == 1 then free_slots(slots) end
  return redis.call('HDEL', KEYS[3], id, '@' .. id)
end

-- Remove up to `n` (<= 1000) holders whose lease ended at or before `now`; return how many.
local function purge_holders(now, n)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, n)
  if #gone > 0 then
    redis.call('ZREM', KEYS[1], unpack(gone))
    redis.call('ZREM', KEYS[2], unpack(gone))
    drop_records(gone)
  end
  return #gone
end

-- Permits held: the slots taken (expired leases not purged yet included).
local function permits_held()
  return redis.call('BITCOUNT', KEYS[7])
end

-- A queue member's parts: identifier, permits, ticket number.
local function member_parts(member)
  local number, permits, id = string.match(member, '^(%d+):(%d+):(.*)$')
  return id, tonumber(permits), number
end

-- Remove abandoned waiter tickets; return the number of waiters left.
local function purge_waiters(now)
  local waiting = redis.call('ZCARD', KEYS[4])
  if waiting > 0 then
    local gone = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, 100)
    if #gone > 0 then
      redis.call('ZREM', KEYS[4], unpack(gone))
      redis.call('ZREM', KEYS[5], unpack(gone))
      local ids = {}
      for i, member in ipairs(gone) do ids[i] = member_parts(member) end
      redis.call('HDEL', KEYS[6], unpack(ids))
      waiting = redis.call('ZCARD', KEYS[4])
    end
  end
  return waiting
end

-- The first waiters in serving order whose permits fit in the `free` ones
-- together are entitled to them (the first that does not fit stops the
-- walk: it blocks those behind it, so a large request is not starved): give
-- each one not woken yet CLAIM_MS to come and take its slots (ZADD LT only
-- ever brings a deadline forward; CH says whether it did, i.e. whether this
-- waiter is woken now) and append it to `out`, preceded by the TTL for its
-- wake-up list (that of the queue keys, which outlive every waiter's lease,
-- and at least 10 s). At most `free` members are read (each needs >= 1 permit).
local function wake_first(now, free, out)
  local claim = now + CLAIM_MS
  local first = #out + 1
  local taken = 0
  for _, w in ipairs(redis.call('ZRANGE', KEYS[4], 0, free - 1)) do
    local id, permits = member_parts(w)
    taken = taken + permits
    if taken > free then break end
    if redis.call('ZADD', KEYS[5], 'XX', 'LT', 'CH', claim, w) == 1 then
      if #out < first then out[first] = math.max(10000, redis.call('PTTL', KEYS[5])) end
      out[#out + 1] = id
    end
  end
end

-- Permits came free (release, abandon): pass them to the first waiters.
local function wake(now, limit, out)
  local waiting = purge_waiters(now)
  if waiting == 0 then return end
  purge_holders(now, 100)
  local free = limit - permits_held()
  if free > 0 then wake_first(now, free, out) end
end

-- Record one hold time (ms) in the holds HASH, which must exist (it does while
-- it holds a record: see release.lua), so the HINCRBY keeps its TTL.
local function record_hold(hold)
  if hold < 0 then hold = 0 elseif hold > HOLD_MAX_MS then hold = HOLD_MAX_MS end
  local packed = redis.call('HINCRBY', KEYS[3], HOLDS_FIELD, string.format('%.0f', hold * HOLD_SCALE + 1))
  local n = packed % HOLD_SCALE
  if n >= HOLD_SAMPLES then
    local sum = (packed - n) / HOLD_SCALE
    redis.call('HSET', KEYS[3], HOLDS_FIELD, string.format('%.0f', math.floor(sum / 2) * HOLD_SCALE + n / 2))
  end
end

-- Milliseconds a caller with `ahead` waiters before it can expect to wait,
-- from the recent hold times: each round of `limit` holds frees `limit`
-- slots. nil when no hold has been recorded yet.
local function hold_estimate(ahead, limit)
  if limit < 1 then limit = 1 end  -- paused (limit 0): as if one slot
  local packed = tonumber(redis.call('HGET', KEYS[3], HOLDS_FIELD) or '')
  if not packed then return nil end
  local n = packed % HOLD_SCALE
  if n == 0 then return nil end
  local mean = (packed - n) / HOLD_SCALE / n
  return math.ceil((ahead + 1) / limit) * mean
end

-- Keep the holder keys alive past the latest expiry they hold, plus one second,
-- with one lease to spare (so a partition nobody uses is gone within
-- 2 x lease + 1 s). Invariant: the timeout ZSET's TTL covers every live
-- expiry in it + 1 s, and the other three keys' TTLs are at least as long; so
-- one PTTL tells whether anything needs writing, and a write that is needed
-- (the TTL is below this expiry + 1 s) lengthens the timeout ZSET, while
-- lengthen() keeps the others from being shortened (PEXPIRE ... GT does that
-- in one call, but only from Redis 7.0; this write happens about once per
-- lease per partition, so its three PTTLs cost next to nothing).
-- `fresh`: the partition had no permits held (none before this grant), so the
-- ZSETs were just created, and no holder relies on any of the four TTLs (the
-- slots bitmap's too): set them.
-- `rebuilt`: the holds HASH was just re-created (evicted alone, without a
-- TTL): all four get the longest of their TTLs and this one.
local function keep_alive(now, expiry, lease, fresh, rebuilt)
  local need = expiry - now + 1000
  local ttl = need + lease
  if fresh then
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], ttl)
    redis.call('PEXPIRE', KEYS[3], ttl)
    redis.call('PEXPIRE', KEYS[7], ttl)
  elseif rebuilt then
    ttl = math.max(ttl, redis.call('PTTL', KEYS[1]), redis.call('PTTL', KEYS[2]), redis.call('PTTL', KEYS[7]))
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], ttl)
    redis.call('PEXPIRE', KEYS[3], ttl)
    redis.call('PEXPIRE', KEYS[7], ttl)
  elseif redis.call('PTTL', KEYS[1]) < need then
    redis.call('PEXPIRE', KEYS[1], ttl)
    lengthen(KEYS[2], ttl)
    lengthen(KEYS[3], ttl)
    lengthen(KEYS[7], ttl)
  end
end
