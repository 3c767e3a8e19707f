-- Acquire permits, fairly, in one atomic step.
-- ARGV: limit, lease ms, identifier, meta json, ticket ms (0: do not queue),
--       the caller's ticket number from an earlier refusal ('': none),
--       '1' for a dry run (MODE "dry_run"/"off": admit over the limit too),
--       permits (1..limit), priority (an int: higher is served first),
--       max waiters ('': unbounded; n: a caller that would have to queue
--       while n wait is refused at once), '1' for slot numbers (SLOTS);
--       these last four may be left out (1 permit, priority 0, unbounded,
--       no slot numbers).
-- KEYS[8] (a waiter: ticket ms > 0): the caller's own wake-up list.
-- Returns {1, token, acquired_ms, expires_ms, over limit (1: a dry run admitted
-- a caller enforcing would have refused; 0), slots "3,5" ('' without SLOTS),
-- and, granted by the common case only (absent otherwise): quiet (1: nobody
-- waited and no hold time was wanted, so that its release may be plain
-- commands; 0), full (1: no permit is left free after this grant; 0)}, or,
-- granted beside waiters ahead whose permits were free too (granted first),
-- {1, token, acquired_ms, expires_ms, over limit, slots, wake TTL ms, id,
-- grant, ...} (an odd tail: never eight values), or
-- when refused
-- {0, estimate ms, waiters ahead, recheck ms, ticket number or '', queue full
-- (1: refused because max waiters wait; 0), [wake TTL ms, id, ...]}:
-- the estimated wait (for Retry-After); when a waiter should look again at
-- the latest (a lease expiring or a claim window ending pushes no wake-up);
-- the caller's ticket number if it was queued now (to come back to its place
-- if it is ever dropped); and the waiters whose wake-ups the caller pushes.
local limit = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local id = ARGV[3]
local ticket = tonumber(ARGV[5])
local dry = ARGV[7] == '1'
local permits = tonumber(ARGV[8] or '') or 1
local priority = tonumber(ARGV[9] or '') or 0
local cap = tonumber(ARGV[10] or '')
local numbered = ARGV[11] == '1'
local now, clock = server_ms()
-- One read of the holds HASH: the fair counter (absent: the HASH was just
-- (re)created), the permits held beyond one per holder, the waiters flag, the
-- TTL watermark, and what says whether releases record their hold times (see
-- _lib.lua).
local head = redis.call('HMGET', KEYS[3], '#', '+', 'w', 'e', HOLDS_FIELD, REFUSED_FIELD)
local extra = tonumber(head[2] or '') or 0
local watermark = tonumber(head[4] or '')

-- Grant the permits to this caller, whose timeouts entry (expiring at
-- `expires`) is written; `fresh`: the timeouts ZSET was empty before it (so
-- it was just created, without a TTL).
local function grant(expires, fresh, over, quiet, members, full)
  local st = {
    counter = head[1], extra = extra, watermark = watermark, fresh = fresh,
    now = now, clock = clock, numbered = numbered, members = members,
  }
  local token, taken = hold(st, id, permits, expires, lease, ARGV[4])
  return {1, token, now, expires, over, taken, quiet, full}
end

-- The common case: the HASH is whole, nobody waits, the permits are free.
if head[1] and not head[3] then
  local holders = redis.call('ZCARD', KEYS[1])
  -- The entry, with the members of a holder of up to MEMBERS_MAX permits, in
  -- one ZADD NX: all new unless this is a retry (or an expired entry not
  -- purged yet), which the rest of the script sorts out.
  local members = permits > 1 and permits <= MEMBERS_MAX
  local added = false
  if limit - holders - extra >= permits then
    if members then
      local n = redis.call('ZADD', KEYS[1], 'NX', now + lease, id, members_from(2, id, permits, '+inf'))
      added = n == permits
      if n > 0 and not added and redis.call('HEXISTS', KEYS[3], id) == 0 then
        -- Some were there already, left by a holder of this name that is
        -- gone (an interrupted operation): none of them is anyone's, so they
        -- all go, and the rest of the script counts again without them.
        redis.call('ZREM', KEYS[1], id, members_from(2, id, permits))
      end
    else
      added = redis.call('ZADD', KEYS[1], 'NX', now + lease, id) == 1
    end
  end
  if added then
    -- Quiet: the release will find nothing to do but give the permits back
    -- unless callers queue or are refused meanwhile (which it checks), so it
    -- is plain commands (Lua.release). Not with slot numbers (the bitmap is
    -- written only while it exists) nor the "+" count (only a script lowers it).
    local quiet = hold_count(head[5]) >= HOLD_FIRST and permits <= MEMBERS_MAX and not numbered
      and not (head[6] and now - tonumber(head[6]) < SAMPLE_MS)
    local full = limit - holders - extra - permits < 1
    return grant(now + lease, holders == 0, 0, quiet and 1 or 0, members, full and 1 or 0)
  end
end

-- (the rest of the script)

-- The waiters flag follows the queue (a false "1" only costs a look at it).
-- `queued`: whether the queue holds waiters now (nil: not known, look).
local function flag_waiters(queued)
  if queued == nil then queued = redis.call('EXISTS', KEYS[4]) == 1 end
  if queued and not head[3] then
    redis.call('HSET', KEYS[3], 'w', '1')
    -- A HASH written now for the flag alone gets a TTL (that of the queue).
    if not head[1] and redis.call('PTTL', KEYS[3]) < 0 then
      redis.call('PEXPIRE', KEYS[3], math.max(ticket, lease) + 1000)
    end
  elseif not queued and head[3] then
    redis.call('HDEL', KEYS[3], 'w')
  end
end

-- A waiter granted its permits by a release (direct grant) whose wake-up it
-- missed gets them here: it is a holder already, no longer in the queue.
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

local waiting, soonest = purge_waiters(now)
-- Whether `soonest` is the earliest ticket deadline (nil: the queue is empty).
local deadlines_known = waiting == 0 or soonest ~= nil
local ahead = 0
local member = nil  -- this caller's queue member, once it is in the queue
local number = nil  -- its ticket number
local ranked = nil  -- the waiters ahead of it: the first `ahead` members of the queue (nil: by score)
local qmark = nil  -- the queue keys' TTL watermark (nil: not read, or none)
if waiting > 0 then
  if ticket > 0 then
    local found = redis.call('HMGET', KEYS[6], id, 'e')
    local rec = found[1]
    -- Trusted only if the deadlines ZSET showed its first entry: one that
    -- vanished alone (maxmemory's volatile-* policies evict one key at a
    -- time) is re-created by this caller's ZADD, without a TTL. (After a
    -- purge of tickets, not trusted either: rare, and then it is checked.)
    qmark = soonest and tonumber(found[2] or '')
    number = rec and string.match(rec, '^(%d+):')
    if not number and ARGV[6] and ARGV[6] ~= '' then number = ARGV[6] end
  end
  if number then
    member = number .. ':' .. permits .. ':' .. id
    ranked = redis.call('ZRANK', KEYS[4], member)
    if not ranked then
      -- A waiter dropped from the queue (it missed its claim window, or was
      -- stalled past its ticket) comes back to its place: only the waiters
      -- served before it are ahead of it.
      redis.call('ZADD', KEYS[4], -priority, member)
      redis.call('HSET', KEYS[6], id, number .. ':' .. permits .. ':' .. ARGV[4], '@' .. id, numbered and '1' or '')
      ranked = redis.call('ZRANK', KEYS[4], member)
    end
    ahead = ranked
  else
    -- A newcomer: the waiters of its priority or a higher one are ahead.
    ahead = redis.call('ZCOUNT', KEYS[4], '-inf', -priority)
  end
end

-- The permits the waiters ahead need (at most limit + 1 counted: more never fit).
local needed_ahead = 0
if ahead > 0 then
  if ahead > limit then
    needed_ahead = limit + 1
  else
    local first
    if ranked then
      first = redis.call('ZRANGE', KEYS[4], 0, ahead - 1)
    else
      first = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', -priority, 'LIMIT', 0, ahead)
    end
    for _, w in ipairs(first) do
      local _, p = member_parts(w)
      needed_ahead = needed_ahead + p
      if needed_ahead > limit then break end
    end
  end
end

-- Count before purging: expired leases not purged yet only make the count
-- too high, so a count that leaves room grants at once, and only a
-- semaphore that looks full pays for the purge (then counts again).
local holders
local function count()
  local used
  used, holders = permits_held()
  extra = used - holders
  return used
end
-- The first count takes the "+" count read with the head (nothing has
-- changed it since).
holders = redis.call('ZCARD', KEYS[1])
local used = holders + extra
local expiry = nil  -- the earliest lease expiry after now, once read (false: none)
if limit - used - needed_ahead < permits then
  -- The first entry says whether any lease ended (a purge is due) or, if
  -- none did, when the earliest ends (for refusal_times).
  local first = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2] or '')
  if first and first <= now then
    if purge_holders(now, 1000) > 0 then used = count() end
  else
    -- (Members of score +inf, a weighted holder's, only follow an entry.)
    expiry = first and first < math.huge and first or false
  end
end

local over = 0
local fits = limit - used - needed_ahead >= permits
-- (A waiter's retry was looked for above: a holder already is not queued.)
if not fits and dry then
  -- A dry run: nobody is refused; say whether enforcing would have.
  local again = ticket == 0 and held_again(id, now)
  if again then return again end
  over = 1
end
if fits or over == 1 then
  local expires = now + lease
  -- NX: an identifier already present is a retry (or an expired entry not
  -- purged yet: replaced, and its permits given back first).
  if redis.call('ZADD', KEYS[1], 'NX', expires, id) == 0 then
    local again = held_again(id, now)
    if again then return again end
    drop_record(id)
    count()
    redis.call('ZADD', KEYS[1], expires, id)
  end
  if member then
    redis.call('ZREM', KEYS[4], member)
    redis.call('ZREM', KEYS[5], member)
    redis.call('HDEL', KEYS[6], id, '@' .. id)
    -- A wake-up pushed to this waiter and not read any more.
    if KEYS[8] then redis.call('DEL', KEYS[8]) end
  end
  -- Waiters ahead whose permits are free too (a lease expired, which wakes
  -- nobody, or a quiet release's serve.lua is a round trip behind): granted
  -- first, so that the tokens follow the queue, and woken by the caller (the
  -- reply's wake-up tail, as total_acquire.lua's).
  local first = nil
  if ahead > 0 and over == 0 then
    first = {}
    -- (`holders`: the count before this caller's ZADD, so that st.fresh says
    -- whether that ZADD created the timeouts ZSET.)
    local st = grant_state(now, clock, {holders = holders, head = {head[1], extra, head[4]}})
    waiting = waiting - grant_first(st, needed_ahead, first, limit)
    head[1], extra, watermark = st.counter, st.extra, st.watermark
  end
  local result = grant(expires, holders == 0, over)
  if member then
    flag_waiters(nil)
  else
    flag_waiters(waiting > 0)
  end
  if first then
    for i, v in ipairs(first) do result[6 + i] = v end
  end
  return result
end

local again = ticket == 0 and held_again(id, now)
if again then return again end

-- Refused: releases record their hold times for a while, so that this
-- caller's successors get a Retry-After from recent holds (see HOLD_FIRST).
-- (No "#": the HASH is gone. Written at most once a REFUSED_EVERY: the
-- window ends that much early at most.)
mark_refused(now, head[1], head[6])

local out = {0, 0, ahead, 0, '', 0}
-- Free permits that waiters ahead are entitled to, with nobody taking them (a
-- lease expired, which wakes nobody; or a woken waiter never came): wake
-- those waiters, so that a dead one among them is dropped after its claim
-- window instead of holding up this caller until its ticket runs out.
if used < limit and waiting > 0 then
  -- (The "+" count as last counted; "#" and "e" as read: nothing wrote them.)
  local st = grant_state(now, clock, {holders = holders, head = {head[1], extra, head[4]}})
  local served = grant_first(st, limit - used, out, limit)
  waiting = waiting - served
  -- Served them all: Redis deleted the emptied queue ZSETs, so the watermark
  -- no longer says their TTL (this caller's ticket creates them again).
  if waiting == 0 then qmark = nil end
  if served > 0 then
    -- They were ahead of this caller (the head of the queue), and their claim
    -- leases may be the first to end.
    ahead = math.max(0, ahead - served)
    out[3] = ahead
    expiry = nil
  end
end

if ticket > 0 and not member and cap and waiting >= cap then
  -- MAX_WAITERS wait already: refused at once, not queued.
  out[6] = 1
  ticket = 0
end
if ticket > 0 then
  -- Tickets expire one by one (KEYS[5]); the three queue keys outlive the
  -- longest of a ticket and a lease, as every key does (TTL >= TIMEOUT +
  -- 1 s), and a shorter one never cuts their TTL. As for the holder keys (see
  -- next_watermark), the waiters HASH's "e" says until when they live at
  -- least: a waiter queued before that writes no TTL; otherwise the three move
  -- to a watermark one lease further, with PEXPIREAT (about once per lease),
  -- and a TTL that is longer already is kept: a watermark that falls short is
  -- not passed on, so their TTLs are read (a process of the version before
  -- the watermark lengthens them without moving it).
  local queue_keys = {KEYS[4], KEYS[5], KEYS[6]}
  local expires = now + math.max(ticket, lease)
  local keep = nil
  if not (qmark and qmark >= expires + 1000) then
    keep = next_watermark(now, expires, lease, nil, queue_keys)
  end
  local fields = {}
  if not member then
    -- Tickets are numbered by server time in microseconds: arrival order.  A
    -- waiter that comes back to an empty queue (dropped with every other, or
    -- on a new primary after a failover) keeps its number: the waiters queued
    -- after it that come back too stay behind it.
    number = (ARGV[6] and ARGV[6] ~= '') and ARGV[6]
      or string.format('%.0f', tonumber(clock[1]) * 1000000 + tonumber(clock[2]))
    member = number .. ':' .. permits .. ':' .. id
    redis.call('ZADD', KEYS[4], -priority, member)
    -- "@": whether a direct grant gives it slot numbers (SLOTS).
    fields = {id, number .. ':' .. permits .. ':' .. ARGV[4], '@' .. id, numbered and '1' or ''}
    out[5] = number
  end
  if keep then
    fields[#fields + 1] = 'e'
    fields[#fields + 1] = keep
  end
  if #fields > 0 then redis.call('HSET', KEYS[6], unpack(fields)) end
  redis.call('ZADD', KEYS[5], now + ticket, member)
  if keep then keep_until(keep, queue_keys) end
end

-- A queued caller's earliest ticket deadline: that read by purge_waiters, or
-- its own if earlier (a waiter granted above may have had the one read: a
-- recheck then comes early, which costs a look, never late); unknown (nil)
-- if purge_waiters removed any.
if ticket > 0 and deadlines_known then
  soonest = math.min(soonest or math.huge, now + ticket)
else
  soonest = nil
end
out[2], out[4] = refusal_times(now, lease, ahead + permits - 1, limit, ticket > 0, {
  packed = head[5], expiry = expiry, soonest = soonest,
})
flag_waiters(ticket > 0 or waiting > 0)
return out
