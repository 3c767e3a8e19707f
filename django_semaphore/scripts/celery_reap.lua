-- Whether a reaper may give back the slot of a dead run (orphans.py): its task
-- id's slot record (KEYS[1]) still names it (no later run claimed the task id,
-- and the run did not end), and its ticket (adoption mark KEYS[2]) was adopted
-- by nobody or by the run's own task id.  If so, the record goes and the mark
-- says "reaped": a redelivered run can no longer adopt the slot.
-- ARGV: the dead run's record, its task id, the mark's TTL (ms). 1 if so.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local adopter = redis.call('GET', KEYS[2])
if adopter and adopter ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], 'reaped', 'PX', ARGV[3])
return 1
