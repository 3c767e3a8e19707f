-- Forget a partition only if nobody registered it again since it was read
-- (a park writes a new nonce). KEYS[1] the registry, ARGV: field, value read.
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
