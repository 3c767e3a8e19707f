-- Claim a task id's run (KEYS[1]): "done" once a run completed, "run:..." while
-- a live run renews it (its heartbeat), absent otherwise.  KEYS[2]: the task
-- id's slot record ("<host>:<pid>:<lease identifier>", written by the run that
-- holds a slot, kept as long as its lease can live).
-- ARGV: the claimant's "run:..." value, the heartbeat TTL (ms).
-- Returns {1, the slot record or ''} if claimed, else the value found (the caller decides).
local found = redis.call('GET', KEYS[1])
if found then return found end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, redis.call('GET', KEYS[2]) or ''}
