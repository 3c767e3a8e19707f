-- Release a slot. ARGV: identifier, limit, wake prefix.
-- Returns 1 if the identifier still held a live slot, else 0.
local id = ARGV[1]
local now = server_ms()
local expiry = redis.call('ZSCORE', KEYS[1], id)
redis.call('ZREM', KEYS[1], id)
redis.call('ZREM', KEYS[2], id)
redis.call('HDEL', KEYS[3], id)
if redis.call('EXISTS', KEYS[4]) == 1 then
  wake(now, tonumber(ARGV[2]), ARGV[3])
end
if expiry and tonumber(expiry) > now then return 1 end
return 0
