-- Acquire in the common case only, or say it is not the common case: the
-- uncontended acquire at the cost of the few calls it needs, for callers that
-- ask for nothing the common case does not give (at most MEMBERS_MAX
-- permits, no slot numbers, not a waiter coming back with its ticket).
-- KEYS: only the two this touches: KEYS[1] the timeouts ZSET, KEYS[2] the
-- holds HASH (KEYS[1] and KEYS[3] of acquire.lua; see _lib.lua for both).
-- ARGV: limit, lease ms, identifier, and the record's tail: the meta JSON,
-- after the permits tag for more than one permit ("m3{...}": see tag_of),
-- so that a weighted call sends no argument more and the record is written
-- as it comes; for a name with TOTAL, the TOTAL in force (the identifier
-- starts with the partition, "part/...": limit is the partition's, and the
-- grant counts in the partition's "c/" and "s/" fields, as
-- total_acquire.lua's common case does).
-- Returns "token:acquired_ms:quiet:full" (quiet and full: as acquire.lua's
-- common case, 1 or 0), or false when
-- anything is unusual, before writing anything that acquire.lua would not
-- have written the same way: the caller then runs acquire.lua, which
-- decides (the HASH is new, callers wait, the permits are not free, the TTL
-- watermark must move, the identifier is there already, the clock is behind
-- the fair counter).
--
-- Cheaper than acquire.lua's own common case by what it leaves out: five
-- KEYS and three ARGV fewer (Redis makes a Lua string of each, for every
-- call), and no number made from a string or a string from a number where
-- the server's strings do: the token and the acquired time are cut from
-- TIME's reply, compared with the fair counter as strings of digits.
local t = redis.call('TIME')
local total = ARGV[5]
local part, count, head
if total then
  -- (The client sends TOTAL only with an identifier that has its partition.)
  part = string.sub(ARGV[3], 1, string.find(ARGV[3], '/', 1, true) - 1)
  count = 'c/' .. part
  head = redis.call('HMGET', KEYS[2], '#', '+', 'w', 'e', HOLDS_FIELD, REFUSED_FIELD, count)
else
  head = redis.call('HMGET', KEYS[2], '#', '+', 'w', 'e', HOLDS_FIELD, REFUSED_FIELD)
end
local counter = head[1]
if not counter or head[3] then return false end
-- The token is the server time in microseconds if it is above the counter
-- (compared as strings of digits: as numbers when they have the same
-- length); otherwise acquire.lua adds one to the counter.
local usec = t[2]
local token = t[1] .. string.rep('0', 6 - #usec) .. usec
if #token ~= #counter or token <= counter then return false end
local now_ms = string.sub(token, 1, -4)
local now = tonumber(now_ms)
local expires = now + tonumber(ARGV[2])
local score = string.format('%d', expires)
-- The watermark says until when the keys live at least; a grant that would
-- outlive it moves it (acquire.lua, about once per lease).
local watermark = head[4]
if not watermark or tonumber(watermark) < expires + 1000 then return false end
-- The meta JSON starts with "{" (123); a tag here is "m" (109) and one digit.
-- (Bytes, not a string comparison: Lua compares strings in the server's
-- locale.)
local tail = ARGV[4]
local permits = 1
local first, digit, brace = string.byte(tail, 1, 3)
if first ~= 123 then
  if first ~= 109 or brace ~= 123 then return false end
  permits = digit - 48
  if permits < 2 or permits > MEMBERS_MAX then return false end
end
local holders = redis.call('ZCARD', KEYS[1])
-- The permits left free (with TOTAL: in the name, and in the partition, the fewer).
local free = tonumber(total or ARGV[1]) - holders - (head[2] and tonumber(head[2]) or 0) - permits
local held
if total then
  held = head[7] and tonumber(head[7]) or 0
  local mine = tonumber(ARGV[1]) - held - permits
  if mine < free then free = mine end
end
if free < 0 then return false end
local id = ARGV[3]
if permits > 1 then
  -- (The client sends no more than MEMBERS_MAX; held above too, so that the
  -- two never disagree on which holders are members.)
  local n = redis.call('ZADD', KEYS[1], 'NX', score, id, members_from(2, id, permits, '+inf'))
  if n ~= permits then
    -- As acquire.lua's common case: members left by a holder of this name
    -- that is gone go, and acquire.lua counts again without them.
    if n > 0 and redis.call('HEXISTS', KEYS[2], id) == 0 then
      redis.call('ZREM', KEYS[1], id, members_from(2, id, permits))
    end
    return false
  end
else
  if redis.call('ZADD', KEYS[1], 'NX', score, id) == 0 then return false end
end
if total then
  -- (A count below 10 as its digit: a number would be formatted by sprintf.)
  held = held + permits
  if held < 10 then held = string.char(48 + held) end
  redis.call('HSET', KEYS[2], '#', token, id, token .. ':' .. now_ms .. ':' .. tail, count, held, 's/' .. part, token)
else
  redis.call('HSET', KEYS[2], '#', token, id, token .. ':' .. now_ms .. ':' .. tail)
end
-- The timeouts ZSET was empty: the ZADD created it, the watermark is its TTL.
if holders == 0 then redis.call('PEXPIREAT', KEYS[1], watermark) end
local refused = head[6]
local quiet = hold_count(head[5]) >= HOLD_FIRST and not (refused and now - tonumber(refused) < SAMPLE_MS)
return token .. ':' .. now_ms .. (quiet and ':1' or ':0') .. (free < 1 and ':1' or ':0')
