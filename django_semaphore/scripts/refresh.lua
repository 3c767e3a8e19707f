-- Extend a live lease; never re-acquire a lost one. ARGV: identifier, lease
-- ms, and for a waiter's claim (optional) the fencing token its grant gave:
-- refreshed only if the holder's record has it, else the grant was an
-- earlier one, whose claim ran out (its token and slots are not the
-- holder's).
-- Returns the new expiry (ms), or 0 if the slot had been lost (or, for a
-- claim, it is not that grant's: nothing is changed).
local id = ARGV[1]
local now = server_ms()
local expiry = redis.call('ZSCORE', KEYS[1], id)
-- No entry: whatever removed it (a purge, an operator's or an acquire's; a
-- force-release; an earlier refresh that found it expired) gave its permits
-- back with it, so nothing is given back twice (with TOTAL, the partition's
-- count would fall below its holders and admit too many).
if not expiry then return 0 end
if tonumber(expiry) <= now then
  redis.call('ZREM', KEYS[1], id)
  drop_record(id)
  return 0
end
local mark
if ARGV[3] then
  -- (The record and the watermark in one read: a claim costs no call more.)
  local found = redis.call('HMGET', KEYS[3], id, 'e')
  if not found[1] or string.sub(found[1], 1, #ARGV[3] + 1) ~= ARGV[3] .. ':' then return 0 end
  mark = found[2]
else
  mark = redis.call('HGET', KEYS[3], 'e')
end
local lease = tonumber(ARGV[2])
local expires = now + lease
redis.call('ZADD', KEYS[1], 'XX', expires, id)
local keep = next_watermark(now, expires, lease, tonumber(mark or ''))
if keep then
  redis.call('HSET', KEYS[3], 'e', keep)
  keep_until(keep)
end
return expires
