-- Remove every expired holder (and owner entries without a live lease).
-- ARGV: "1" to only count (dry run). Returns the number of identifiers removed.
local now = server_ms()
local dry = ARGV[1] == '1'
local removed = 0
if dry then
  removed = redis.call('ZCOUNT', KEYS[1], '-inf', now)
else
  local n
  repeat
    n = purge_holders(now, 1000)
    removed = removed + n
  until n < 1000
end
-- Owner entries with no lease (left by an interrupted pipeline variant).
local orphans = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local expiry = redis.call('ZSCORE', KEYS[1], id)
  if not expiry or (not dry and tonumber(expiry) <= now) then orphans[#orphans + 1] = id end
end
if #orphans > 0 and not dry then
  for i = 1, #orphans, 1000 do
    local chunk = {unpack(orphans, i, math.min(i + 999, #orphans))}
    redis.call('ZREM', KEYS[2], unpack(chunk))
    redis.call('HDEL', KEYS[3], unpack(chunk))
  end
end
if not dry then purge_waiters(now) end
return removed + #orphans
