-- Run a queued transaction atomically: the asyncio cluster client's stand-in
-- for MULTI/EXEC. ARGV: n1, word1..wordn1, n2, ...; KEYS: the keys (one slot).
-- Replies as EXEC would give them (nil as false, scores as strings).
local out = {}
local i = 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  out[#out + 1] = redis.call(unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
return out
