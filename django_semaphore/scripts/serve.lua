-- Serve the waiters after a quiet release: a lease granted while nobody waited
-- gives its permit back with plain commands (see Lua.release), which read the
-- waiters flag after removing the holder; when it was set, this script grants
-- the permits that came free to the first waiters, as release.lua does.
-- ARGV: limit, the hold time to record (ms; '': none, the lease had expired),
-- and for a name with TOTAL the TOTAL in force (after total_quiet_release.lua:
-- the permits go by the fair-share policy, as total_release.lua serves them).
-- Returns {0, [wake TTL ms, id, grant, ...]}: the waiters granted, whose
-- wake-ups the caller pushes (wake.lua).
local now, clock = server_ms()
local found = redis.call('HMGET', KEYS[3], 'w', '#')
if not found[1] then return {0} end  -- served meanwhile, or the keys expired
-- Callers wait: their Retry-After comes from the recent holds. The "#" counter
-- is there, so the HASH exists and the HINCRBY does not create it without a TTL.
local ms = tonumber(ARGV[2] or '')
if ms and found[2] then record_hold(ms) end
local out = {0}
local total = tonumber(ARGV[3] or '')
if not total then
  serve(now, clock, tonumber(ARGV[1]), out, nil)
  return out
end

-- (the rest of the script)
serve_total(now, clock, tonumber(ARGV[1]), total, out)
return out
