-- A handoff ticket is single-use: mark the holder's identifier adopted.
-- KEYS[1] the partition's adoption mark of that identifier; ARGV: who adopts
-- (the same adopter may adopt again: a redelivered Celery task), TTL (ms: as
-- long as the ticket can be read). 1 if this adopter has it, else 0.
local by = redis.call('GET', KEYS[1])
if by and by ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
