-- Claim a task id's run (KEYS[1]): "done" once a run completed, "run:..." while
-- a live run renews it (its heartbeat), absent otherwise.  KEYS[2]: the task
-- id's slot record ("<host>:<pid>:<lease identifier>", written by the run that
-- holds a slot, kept as long as its lease can live), which the claimant takes
-- over: its host and pid in place of the old ones (so that no reaper gives the
-- slot back under it: orphans.py).
-- ARGV: the claimant's "run:..." value, the heartbeat TTL (ms), the
-- claimant's "<host>:<pid>:".
-- Returns {1, the slot record as it was, or ''} if claimed, else the value
-- found (the caller decides).
local found = redis.call('GET', KEYS[1])
if found then return found end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local slot = redis.call('GET', KEYS[2])
if not slot then return {1, ''} end
local identifier = string.match(slot, '^[^:]*:[^:]*:(.*)$')
if identifier then redis.call('SET', KEYS[2], ARGV[3] .. identifier, 'KEEPTTL') end
return {1, slot}
