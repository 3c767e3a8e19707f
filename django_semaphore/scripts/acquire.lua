-- Acquire a slot, fairly, in one atomic step.
-- ARGV: limit, lease ms, identifier, meta json, ticket ms (0: do not queue),
--       the caller's ticket number from an earlier refusal ('': none),
--       '1' for a dry run (MODE "dry_run"/"off": admit over the limit too).
-- KEYS[7] (a waiter: ticket ms > 0): the caller's own wake-up list.
-- Returns {1, token, acquired_ms, expires_ms, over limit (1: a dry run admitted
-- a caller enforcing would have refused; 0)}, or when refused
-- {0, estimate ms, waiters ahead, recheck ms, ticket number or '', [wake TTL ms, id, ...]}:
-- the estimated wait (for Retry-After); when a waiter should look again at
-- the latest (a lease expiring or a claim window ending pushes no wake-up);
-- the caller's ticket number if it was queued now (to come back to its place
-- if it is ever dropped); and the waiters whose wake-ups the caller pushes.
local limit = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local id = ARGV[3]
local ticket = tonumber(ARGV[5])
local dry = ARGV[7] == '1'
local now, clock = server_ms()

-- A retried acquire (same identifier) that already got its slot gets it again.
local function held_again()
  local held = redis.call('ZSCORE', KEYS[1], id)
  if held and tonumber(held) > now then
    local rec = redis.call('HGET', KEYS[3], id)
    if rec then
      local token, acquired = string.match(rec, '^(%d+):(%d+):')
      return {1, token, tonumber(acquired), tonumber(held)}
    end
  end
end

local waiting = purge_waiters(now)
local ahead = waiting
local rank = nil
local number = nil  -- the ticket number of a waiter that is not in the queue (any more)
if waiting > 0 then
  rank = redis.call('ZRANK', KEYS[4], id)
  if rank then
    ahead = rank
  elseif ticket > 0 and ARGV[6] and ARGV[6] ~= '' then
    -- A waiter dropped from the queue (it missed its claim window, or was
    -- stalled past its ticket) comes back to its place: only the waiters
    -- that queued before it are ahead of it.
    number = ARGV[6]
    ahead = redis.call('ZCOUNT', KEYS[4], '-inf', '(' .. number)
  end
end

-- Count before purging: entries that expired but are still there only make
-- the count too high, so a count that leaves room grants at once, and only a
-- semaphore that looks full pays for the purge (then counts again; after a
-- purge every entry left is live, unless more than one batch had expired).
local live = redis.call('ZCARD', KEYS[1])
if limit - live <= ahead then
  local purged = purge_holders(now, 1000)
  if purged == 1000 then
    live = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
  elseif purged > 0 then
    live = live - purged
  end
end

local over = 0
if limit - live <= ahead and dry then
  -- A dry run: nobody is refused; say whether enforcing would have.
  local again = held_again()
  if again then return again end
  over = 1
end
if limit - live > ahead or over == 1 then
  local expires = now + lease
  -- NX: an identifier already present is a retry, found without a ZSCORE
  -- on the common path (or an expired entry not purged yet: replaced).
  if redis.call('ZADD', KEYS[1], 'NX', expires, id) == 0 then
    local again = held_again()
    if again then return again end
    redis.call('ZADD', KEYS[1], expires, id)
  end
  if rank then
    redis.call('ZREM', KEYS[4], id)
    redis.call('ZREM', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id)
  end
  -- A wake-up pushed to this waiter and not read any more.
  if (rank or number) and KEYS[7] then redis.call('DEL', KEYS[7]) end
  -- The fair counter: the next token is the larger of the last token + 1
  -- and the server time in microseconds. Tokens keep increasing across idle
  -- periods in which the keys expired, and across a failover to a replica
  -- that had not yet received the last tokens (as long as the servers'
  -- clocks agree to within the failover time). Returned as a string to stay
  -- exact; past 2^53 the server's integer arithmetic takes over.
  local last = redis.call('HGET', KEYS[3], '#')
  local token
  local n = last and tonumber(last) or 0
  if n >= 9007199254740991 then
    redis.call('HINCRBY', KEYS[3], '#', 1)
    token = redis.call('HGET', KEYS[3], '#')
    redis.call('HSET', KEYS[3], id, token .. ':' .. now .. ':' .. ARGV[4])
  else
    local micros = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
    if micros > n then n = micros else n = n + 1 end
    token = string.format('%.0f', n)
    redis.call('HSET', KEYS[3], '#', token, id, token .. ':' .. now .. ':' .. ARGV[4])
  end
  redis.call('ZADD', KEYS[2], token, id)
  -- live == 0: the ZSETs were (re)created; no counter: the HASH was.
  keep_alive(now, expires, lease, live == 0, not last)
  return {1, token, now, expires, over}
end

local again = held_again()
if again then return again end

local out = {0, 0, ahead, 0, ''}
-- Free slots that waiters ahead are entitled to, with nobody taking them (a
-- lease expired, which wakes nobody; or a woken waiter never came): wake
-- those waiters, so that a dead one among them is dropped after its claim
-- window instead of holding up this caller until its ticket runs out.
if live < limit and waiting > 0 then wake_first(now, limit - live, out) end

if ticket > 0 then
  if not rank then
    -- Tickets are numbered by server time in microseconds: arrival order.
    number = number or string.format('%.0f', tonumber(clock[1]) * 1000000 + tonumber(clock[2]))
    redis.call('ZADD', KEYS[4], number, id)
    redis.call('HSET', KEYS[6], id, ARGV[4])
    out[5] = number
  end
  redis.call('ZADD', KEYS[5], now + ticket, id)
  -- Tickets expire one by one (KEYS[5]); the keys outlive the longest of a
  -- ticket and a lease, as every key does (TTL >= TIMEOUT + 1 s), and a
  -- shorter lease never cuts their TTL. The two ZSETs hold the same waiters,
  -- so they exist together and share one TTL.
  local keep = math.max(ticket, lease) + 1000
  if redis.call('PTTL', KEYS[5]) < keep then
    redis.call('PEXPIRE', KEYS[4], keep)
    redis.call('PEXPIRE', KEYS[5], keep)
  end
  -- The waiters' meta: the same lifetime, never shortened.
  lengthen(KEYS[6], keep)
end

local first = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local until_expiry = lease
if first[2] then until_expiry = tonumber(first[2]) - now end
-- Retry-After: from the recent hold times and the queue ahead, never later
-- than the earliest expiry (a slot is free then at the latest).
local estimate = hold_estimate(ahead, limit)
if not estimate or estimate > until_expiry then estimate = until_expiry end
out[2] = math.ceil(estimate)
local recheck = until_expiry
if ticket > 0 then
  -- The earliest ticket deadline: a woken waiter's claim window ending.
  local soonest = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
  if soonest[2] and tonumber(soonest[2]) - now < recheck then recheck = tonumber(soonest[2]) - now end
end
out[4] = recheck
return out
