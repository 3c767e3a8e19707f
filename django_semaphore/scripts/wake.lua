-- Push their grants to the waiters whose wake-up lists are KEYS (the waiters
-- an acquire, release or abandon script granted permits: one partition, one
-- slot). ARGV[1]: the TTL for the lists, ms (a list already living longer
-- keeps its TTL); ARGV[i + 1]: the grant for KEYS[i] (see grant_first in _lib.lua).
local ttl = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  push_grant(key, ARGV[i + 1], ttl)
end
return #KEYS
