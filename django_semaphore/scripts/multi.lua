-- Run a queued transaction atomically: the asyncio cluster client's stand-in
-- for MULTI/EXEC. ARGV: n1, word1..wordn1, n2, ...; KEYS: the keys (one slot).
-- Replies as EXEC would give them (nil as false, scores as strings).
-- "LENGTHEN", ttl ms, key...: scripting.lengthen()'s EVAL, which a script
-- cannot send (reply nil, as the EVAL's).
local out = {}
local i = 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  if ARGV[i + 1] == 'LENGTHEN' then
    local ttl = tonumber(ARGV[i + 2])
    for j = i + 3, i + n do lengthen(ARGV[j], ttl) end
    out[#out + 1] = false
  else
    out[#out + 1] = redis.call(unpack(ARGV, i + 1, i + n))
  end
  i = i + n + 1
end
return out
