-- Release a holder's permits. ARGV: identifier, limit, when the lease was
-- granted (server ms, to record the hold time; '': record nothing).
-- Returns {1 if the identifier still held a live lease else 0, [wake TTL ms, id, ...]}:
-- the waiters whose wake-ups the caller pushes (wake.lua).
local id = ARGV[1]
local acquired = tonumber(ARGV[3] or '')
local now = server_ms()
local expiry = redis.call('ZSCORE', KEYS[1], id)
local live = expiry and tonumber(expiry) > now
redis.call('ZREM', KEYS[1], id)
redis.call('ZREM', KEYS[2], id)
-- Only a hold that ended with a release says how long the work takes (not a
-- lease that expired, nor a force-release). The record was there, so the
-- HASH still exists (the "#" counter is written with every record) and the
-- HINCRBY does not create it without a TTL.
if drop_record(id) > 0 and live and acquired then
  record_hold(now - acquired)
end
local out = {live and 1 or 0}
if redis.call('EXISTS', KEYS[4]) == 1 then
  wake(now, tonumber(ARGV[2]), out)
end
return out
