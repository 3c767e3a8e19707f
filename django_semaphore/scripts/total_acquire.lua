-- Acquire permits of one partition of a name with TOTAL, in one atomic step:
-- at most `limit` permits in the partition and `total` in the name.
-- The keys are the name's (every partition shares them: see _lib.lua); the
-- identifier starts with the partition, "part/...".
-- ARGV: limit, lease ms, identifier, meta json, ticket ms (0: do not queue),
--       the caller's ticket number from an earlier refusal ('': none),
--       '1' for a dry run, permits, priority (17 digits, lower for a higher
--       priority), max waiters ('': unbounded; counted in the partition),
--       '1' for slot numbers, total.
-- KEYS[8] (a waiter: ticket ms > 0): the caller's own wake-up list.
-- Returns {1, token, acquired_ms, expires_ms, over limit (a dry run's caller
-- that enforcing would have refused: 1, or 2 when its partition had room and
-- the name had none; else 0), slots, [wake TTL ms, id, grant, ...]}, or from
-- the common case {1, token, acquired_ms, expires_ms, 0, slots, quiet, full}
-- (as acquire.lua's: eight values, which a wake-up tail, a TTL and pairs,
-- never makes),
-- or when refused {0, estimate ms, waiters ahead, recheck ms, ticket number
-- or '', queue full, total (1: the partition had room, the name did not),
-- [wake TTL ms, id, grant, ...]} (see acquire.lua; the waiters granted
-- permits by this call are pushed by the caller).
local limit = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local id = ARGV[3]
local ticket = tonumber(ARGV[5])
local dry = ARGV[7] == '1'
local permits = tonumber(ARGV[8])
local prio = ARGV[9]
local cap = tonumber(ARGV[10] or '')
local numbered = ARGV[11] == '1'
local total = tonumber(ARGV[12])
local part = string.match(id, '^([^/]+)/')
local now, clock = server_ms()
-- One read of the holds HASH: the fair counter, the permits held beyond one
-- per holder, the waiters flag, the TTL watermark, the partition's permits,
-- when a caller was last refused, the recent hold times.
local head = redis.call('HMGET', KEYS[3], '#', '+', 'w', 'e', 'c/' .. part, REFUSED_FIELD, HOLDS_FIELD)
local extra = tonumber(head[2] or '') or 0
local held = tonumber(head[5] or '') or 0

local function grant(expires, fresh, over)
  local st = {
    counter = head[1], extra = extra, watermark = tonumber(head[4] or ''), fresh = fresh,
    now = now, clock = clock, numbered = numbered, part = part, held = held,
  }
  local token, taken = hold(st, id, permits, expires, lease, ARGV[4])
  return {1, token, now, expires, over, taken}
end

-- The common case: the HASH is whole, nobody waits, the permits are free in
-- the partition and in the name. Quiet and full as in acquire.lua: the
-- release of a quiet grant is total_quiet_release.lua, and a grant that
-- leaves a permit free in both sends the partition's next acquire to
-- acquire_fast.lua.
if head[1] and not head[3] and limit - held >= permits then
  local holders = redis.call('ZCARD', KEYS[1])
  if total - holders - extra >= permits and redis.call('ZADD', KEYS[1], 'NX', now + lease, id) == 1 then
    local quiet = hold_count(head[7]) >= HOLD_FIRST and permits <= MEMBERS_MAX and not numbered
      and not (head[6] and now - tonumber(head[6]) < SAMPLE_MS)
    local full = math.min(total - holders - extra, limit - held) - permits < 1
    local reply = grant(now + lease, holders == 0, 0)
    reply[7] = quiet and 1 or 0
    reply[8] = full and 1 or 0
    return reply
  end
end

-- (the rest of the script)

if ticket > 0 then
  local again = held_again(id, now)
  if again then
    if KEYS[8] then redis.call('DEL', KEYS[8]) end
    return again
  end
  -- Not a holder: a grant still in its wake-up list is one it missed (its
  -- claim ran out), which it must not take for a later one.
  if KEYS[8] then redis.call('DEL', KEYS[8]) end
end

local waiting = purge_waiters(now)
-- The waiters flag follows the queue (a false "1" only costs a look at it).
local function flag_waiters(keep)
  if redis.call('EXISTS', KEYS[4]) == 1 then
    if not head[3] then
      redis.call('HSET', KEYS[3], 'w', '1')
      -- A HASH written now for the flag alone gets a TTL (that of the queue).
      if not head[1] and redis.call('PTTL', KEYS[3]) < 0 then redis.call('PEXPIRE', KEYS[3], keep) end
    end
  elseif head[3] then
    redis.call('HDEL', KEYS[3], 'w')
  end
end
-- The partition's permits and the name's (expired leases not purged yet make
-- them too high: purged when the caller does not fit, then counted again).
local function counts()
  local used, holders = permits_held()
  extra = used - holders
  held = tonumber(redis.call('HGET', KEYS[3], 'c/' .. part) or '') or 0
  return used, holders
end
-- Make the caller a holder over the counts just read (`over`: a dry run's
-- caller that enforcing would have refused).
local function admit(over, out)
  local expires = now + lease
  -- Read before the ZADD, which creates the timeouts ZSET if it is empty
  -- (hold() then gives it its TTL).
  local st = grant_state(now, clock)
  if redis.call('ZADD', KEYS[1], 'NX', expires, id) == 0 then
    local again = held_again(id, now)
    if again then return again end
    drop_record(id)
    counts()
    redis.call('ZADD', KEYS[1], expires, id)
    st = grant_state(now, clock)  -- (the drop may have changed the "+" count)
  end
  st.numbered = numbered
  st.part = part
  st.held = held
  local token, taken = hold(st, id, permits, expires, lease, ARGV[4])
  local reply = {1, token, now, expires, over, taken}
  for i = 8, #out do reply[i - 1] = out[i] end
  return reply
end

local used = counts()
if held + permits > limit or used + permits > total or waiting > 0 then
  if purge_holders(now, 1000) > 0 then used = counts() end
end
local keep = math.max(ticket, lease) + 1000
local out = {0, 0, 0, 0, '', 0, 0}
if waiting == 0 and held + permits <= limit and used + permits <= total then
  return admit(0, out)
end

-- The caller joins its partition's queue (for this call only, unless it may
-- wait), and the grants go as the policy says: it is admitted if they reach it.
local number = nil
if ticket > 0 then
  local rec = redis.call('HGET', KEYS[6], id)
  number = rec and string.match(rec, '^(%d+):')
  if not number and ARGV[6] and ARGV[6] ~= '' then number = ARGV[6] end
end
local newcomer = not number
if newcomer then number = string.format('%.0f', tonumber(clock[1]) * 1000000 + tonumber(clock[2])) end
local member = part .. '|' .. prio .. '|' .. number .. ':' .. permits .. ':' .. id
local inserted = redis.call('ZADD', KEYS[4], 0, member) == 1
if inserted then
  redis.call('HSET', KEYS[6], id, number .. ':' .. permits .. ':' .. ARGV[4], '@' .. id, (numbered and '1' or '') .. '|' .. prio)
  ready_update(part)
end
local me = {id = id, lease = lease}
grant_total(now, clock, limit, total, out, me)
if me.granted then
  redis.call('ZREM', KEYS[5], member)
  if KEYS[8] then redis.call('DEL', KEYS[8]) end
  flag_waiters(keep)
  local reply = {1, me.granted[1], now, me.granted[2], 0, me.granted[3]}
  for i = 8, #out do reply[i - 1] = out[i] end
  return reply
end

-- Not admitted. Where the caller stands: the waiters of its partition ahead
-- of it; whether its own partition had room (else the name was full).
local ahead = redis.call('ZLEXCOUNT', KEYS[4], '[' .. part .. '|', '(' .. member)
local others = redis.call('ZLEXCOUNT', KEYS[4], '[' .. part .. '|', '(' .. part .. '}') - 1
used = counts()
local room = held + permits <= limit and ahead == 0

-- Out of the queue again: not allowed to wait (a dry run, no WAIT), or
-- MAX_WAITERS wait already in its partition.
local queue_full = ticket > 0 and newcomer and cap and others >= cap
if ticket == 0 or queue_full then
  if inserted then
    redis.call('ZREM', KEYS[4], member)
    redis.call('HDEL', KEYS[6], id, '@' .. id)
    ready_update(part)
  end
  if dry then
    -- Over the limit: 2 when only the name was full (reason "total").
    flag_waiters(keep)
    return admit(room and 2 or 1, out)
  end
  ticket = 0
end

mark_refused(now, head[1], head[6])
out[3] = ahead
out[6] = queue_full and 1 or 0
out[7] = room and 1 or 0
if ticket > 0 then
  out[5] = number
  redis.call('ZADD', KEYS[5], now + ticket, member)
  -- The queue's keys outlive the longest of a ticket and a lease, never shortened.
  if redis.call('PTTL', KEYS[5]) < keep then
    redis.call('PEXPIRE', KEYS[4], keep)
    redis.call('PEXPIRE', KEYS[5], keep)
    redis.call('PEXPIRE', KEYS[2], keep)
  end
  lengthen(KEYS[6], keep)
end
flag_waiters(keep)

out[2], out[4] = refusal_times(now, lease, ahead + permits - 1, math.min(limit, total), ticket > 0)
return out
