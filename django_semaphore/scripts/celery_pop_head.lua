-- Remove the first parked task only if it is still the message the caller sent
-- (a dispatcher that lost its lock must not remove another's head).
-- KEYS[1] the LIST, ARGV[1] the message, ARGV[2] the TTL (ms) of the tasks left:
-- a backlog being sent is kept (only ever lengthened, as celery_push.lua does).
-- Returns 1 if removed.
if redis.call('LINDEX', KEYS[1], 0) == ARGV[1] then
  redis.call('LPOP', KEYS[1])
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl ~= -2 and ttl < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  return 1
end
return 0
