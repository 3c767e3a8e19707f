-- A live run's heartbeat: renew its claim (KEYS[1]) while it still holds the
-- run's value, and then its slot record (KEYS[2]) while that holds the run's.
-- ARGV: the claim's value, its TTL (ms), the slot record's value ('': none yet),
-- its TTL (ms).  1 if the claim was renewed (0: lost).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
return 1
