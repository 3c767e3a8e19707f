-- End a run claimed with celery_claim_run.lua, if still the caller's.
-- KEYS[1] the claim, ARGV: the caller's value, the new value ('' deletes the
-- claim: the task id may run again), its TTL (ms). 1 if it was the caller's.
-- KEYS[2], ARGV[4] (optional): the task id's slot record and the caller's
-- value there, deleted if it is still that.
if #KEYS > 1 and redis.call('GET', KEYS[2]) == ARGV[4] then redis.call('DEL', KEYS[2]) end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
