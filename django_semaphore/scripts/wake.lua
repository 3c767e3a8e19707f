-- Push a wake-up to the waiters whose wake-up lists are KEYS (the identifiers
-- an acquire, release or abandon script returned; one partition, one slot).
-- ARGV[1]: the TTL for the lists, ms (a list already living longer keeps its TTL).
local ttl = tonumber(ARGV[1])
for _, key in ipairs(KEYS) do
  redis.call('RPUSH', key, '1')
  lengthen(key, ttl)
end
return #KEYS
