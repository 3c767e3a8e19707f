-- Claim a task id's run (KEYS[1]): "done" once a run completed, "run:..." while
-- a live run renews it (its heartbeat), absent otherwise.
-- ARGV: the claimant's "run:..." value, the heartbeat TTL (ms).
-- Returns 1 if claimed, else the value found (the caller decides).
local found = redis.call('GET', KEYS[1])
if found then return found end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
