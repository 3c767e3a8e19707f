-- Release a holder's permits in a name with TOTAL (see release.lua).
-- ARGV: identifier ("part/..."), limit, when the lease was granted (server ms,
-- to record the hold time; '': record nothing), total.
-- Returns {1 if the identifier still held a live lease else 0, [wake TTL ms, id, grant, ...]}.
-- The common case is as release.lua's five calls: the partition's count is
-- read with the rest and written by the HDEL that ends the record when it
-- comes to 0 (else one HINCRBY more).
local id = ARGV[1]
local acquired = tonumber(ARGV[3] or '')
local part = string.match(id, '^([^/]+)/')
local now, clock = server_ms()
local expiry = redis.call('ZSCORE', KEYS[1], id)
local live = expiry and tonumber(expiry) > now
local found = redis.call('HMGET', KEYS[3], '*' .. id, '@' .. id, 'w', HOLDS_FIELD, REFUSED_FIELD, 'c/' .. part, id)
local tag = tag_of(found[7], found[1])
local had = redis.call('ZREM', KEYS[1], id) == 1
local permits = permits_of(tag)
local left = (tonumber(found[6] or '') or 0) - permits
if had and left <= 0 then
  redis.call('HDEL', KEYS[3], id, '*' .. id, '@' .. id, 'c/' .. part, 's/' .. part)
else
  redis.call('HDEL', KEYS[3], id, '*' .. id, '@' .. id)
  if had then redis.call('HINCRBY', KEYS[3], 'c/' .. part, -permits) end
end
if tag then give_back_one(id, tag) end
if found[2] and found[2] ~= '' and redis.call('EXISTS', KEYS[7]) == 1 then free_slots(found[2]) end
if had and live and acquired and (
  found[3] or hold_count(found[4]) < HOLD_FIRST
  or (found[5] and now - tonumber(found[5]) < SAMPLE_MS)
) then
  record_hold(now - acquired)
end
if not found[3] then return {live and 1 or 0} end

-- (the rest of the script)
local out = {live and 1 or 0}
serve_total(now, clock, tonumber(ARGV[2]), tonumber(ARGV[4]), out)
return out
