-- Release a holder's permits. ARGV: identifier, limit, when the lease was
-- granted (server ms, to record the hold time; '': record nothing), and
-- optionally the waiters its grant named as likely to come next, whose
-- wake-up lists are KEYS[8], KEYS[9]...: a grant to one of them is pushed
-- here (see grant_first).
-- Returns {1 if the identifier still held a live lease else 0, [wake TTL ms, id, ...]}:
-- the other waiters granted, whose wake-ups the caller pushes (wake.lua).
-- The common case (one permit, no slot numbers, nobody waiting) is five
-- calls: TIME, ZSCORE, one HMGET (the holder's record, for its permits, and
-- slots, the waiters flag, the hold count; and the fair counter, "+" count and
-- TTL watermark that a direct grant needs), ZREM, HDEL (the token lives in the record: there is
-- no owners entry to remove); a weighted holder's other permits are one ZREM
-- more, or a HINCRBY of the "+" count (more than MEMBERS_MAX). (A quiet lease
-- is given back without this script: see Lua.release.)
local id = ARGV[1]
local acquired = tonumber(ARGV[3] or '')
local now, clock = server_ms()
local expiry = redis.call('ZSCORE', KEYS[1], id)
local live = expiry and tonumber(expiry) > now
-- (With "#", "+" and "e" for a direct grant: see the rest of the script.)
local found = redis.call('HMGET', KEYS[3], '*' .. id, '@' .. id, 'w', HOLDS_FIELD, REFUSED_FIELD, '#', '+', 'e', id)
local tag = tag_of(found[9], found[1])
-- With callers waiting, a live entry goes after the grants (its permit counts
-- as free for them): the last holder's entry removed first would delete the
-- timeouts ZSET, and the grant create it again, with a PEXPIREAT more.
local leaving = found[3] and live
if not leaving then redis.call('ZREM', KEYS[1], id) end
local had = redis.call('HDEL', KEYS[3], id, '*' .. id, '@' .. id)
local counted = tag and give_back_one(id, tag) or 0
if found[2] and redis.call('EXISTS', KEYS[7]) == 1 then free_slots(found[2]) end
-- Only a hold that ended with a release says how long the work takes (not a
-- lease that expired, nor a force-release). Recorded while its figure is
-- needed (see HOLD_FIRST): callers wait (their Retry-After comes from these),
-- a caller was refused in the last SAMPLE_MS, or fewer than HOLD_FIRST are
-- recorded. The record was there, so the HASH still exists (the "#" counter
-- is written with every record) and the HINCRBY does not create it without a TTL.
if had > 0 and live and acquired and (
  found[3] or hold_count(found[4]) < HOLD_FIRST
  or (found[5] and now - tonumber(found[5]) < SAMPLE_MS)
) then
  record_hold(now - acquired)
end
if not found[3] then return {live and 1 or 0} end

-- (the rest of the script)
local out = {live and 1 or 0}
local push = nil
for i = 4, #ARGV do
  push = push or {}
  push[ARGV[i]] = KEYS[i + 4]
end
-- The "+" count read above, unless the release lowered it.
local known = {leaving = leaving and 1 or 0}
if counted == 0 then known.head = {found[6], found[7], found[8]} end
serve(now, clock, tonumber(ARGV[2]), out, push, known)
if leaving then redis.call('ZREM', KEYS[1], id) end
return out
