-- Remove the first parked task only if it is still the message the caller sent
-- (a dispatcher that lost its lock must not remove another's head).
-- KEYS[1] the LIST, ARGV[1] the message. Returns 1 if removed.
if redis.call('LINDEX', KEYS[1], 0) == ARGV[1] then
  redis.call('LPOP', KEYS[1])
  return 1
end
return 0
