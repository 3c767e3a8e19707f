-- Remove every expired holder (and owners entries and records without a live lease).
-- ARGV[1]: "1" to only count (dry run).
-- ARGV[2]: the client's now in ms for the variants that write expiries on the
--          client's clock ('' : the server's TIME): an entry is judged by the
--          clock that wrote it.
-- ARGV[3]: "1" when the writer's clock is not known (a semaphore no longer
--          configured): the earlier of ARGV[2] and TIME, so an entry goes only
--          once it has ended on both clocks.
-- Waiter tickets are written on the server's clock and judged by it.
-- Returns the number of identifiers removed (or that would be).
local server = server_ms()
local now = server
if ARGV[2] and ARGV[2] ~= '' then
  now = tonumber(ARGV[2])
  if ARGV[3] == '1' and server < now then now = server end
end
local dry = ARGV[1] == '1'
local removed = 0
if dry then
  removed = redis.call('ZCOUNT', KEYS[1], '-inf', now)
else
  local n
  repeat
    n = purge_holders(now, 1000, true)
    removed = removed + n
  until n < 1000
end
-- Entries with no lease (left by an interrupted operation): owners entries
-- of the seed variants, and holder records (fields whose value is
-- "token:acquired:meta") that no timeouts entry backs.
local orphans = {}
local seen = {}
local function orphan(id)
  if seen[id] then return end
  seen[id] = true
  local expiry = redis.call('ZSCORE', KEYS[1], id)
  if not expiry or (not dry and tonumber(expiry) <= now) then orphans[#orphans + 1] = id end
end
-- (A TOTAL name's KEYS[2] is its ready ZSET: members with "|", no holders.)
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  if not string.find(id, '|', 1, true) then orphan(id) end
end
local fields = redis.call('HGETALL', KEYS[3])
for i = 1, #fields, 2 do
  if string.find(fields[i + 1], '^%d+:%d+:') then orphan(fields[i]) end
end
if #orphans > 0 and not dry then
  for i = 1, #orphans, 1000 do
    local chunk = {unpack(orphans, i, math.min(i + 999, #orphans))}
    redis.call('ZREM', KEYS[2], unpack(chunk))
    drop_records(chunk)
  end
end
-- Members standing for a weighted holder's other permits whose holder's
-- entry is gone (an interrupted operation): they go too, uncounted.
if not dry then
  local stray = {}
  local gone = {}  -- holder id -> whether its entry is gone (one ZSCORE per holder)
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '+inf', '+inf')) do
    local id = string.match(m, '^(.*)#%d+$')
    if id and gone[id] == nil then gone[id] = not redis.call('ZSCORE', KEYS[1], id) end
    if id and gone[id] then stray[#stray + 1] = m end
  end
  for i = 1, #stray, 1000 do
    redis.call('ZREM', KEYS[1], unpack(stray, i, math.min(i + 999, #stray)))
  end
  purge_waiters(server)
end
return removed + #orphans
