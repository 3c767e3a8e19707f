-- End a run claimed with celery_claim_run.lua, if still the caller's.
-- KEYS[1] the claim, ARGV: the caller's value, the new value ('' deletes the
-- claim: the task id may run again), its TTL (ms). 1 if it was the caller's.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
