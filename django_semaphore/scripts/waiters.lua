-- The waiters of one partition in serving order (priority, then ticket), with live tickets only:
-- {now_ms, id, ticket number, record, priority, permits, ...}
-- (record: "ticket:permits:meta json"). ARGV[1] (TOTAL): the partition, or
-- '' for the waiters of every partition; a TOTAL queue holds each partition's
-- waiters in serving order, and the priority comes as "p" .. its 17 digits.
local now = server_ms()
local out = {now}
local queue
if ARGV[1] and ARGV[1] ~= '' then
  local part = ARGV[1]
  queue = redis.call('ZRANGE', KEYS[4], '[' .. part .. '|', '(' .. part .. '}', 'BYLEX')
  -- (ZRANGE BYLEX needs Redis 6.2, as everything here)
  local scored = {}
  for _, member in ipairs(queue) do
    scored[#scored + 1] = member
    scored[#scored + 1] = 0
  end
  queue = scored
else
  queue = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
end
for i = 1, #queue, 2 do
  local member = queue[i]
  local deadline = redis.call('ZSCORE', KEYS[5], member)
  if deadline and tonumber(deadline) > now then
    local id, permits, number = member_parts(member)
    out[#out + 1] = id
    out[#out + 1] = number
    out[#out + 1] = redis.call('HGET', KEYS[6], id) or ''
    local prio = string.match(member, '^[^|]*|(%d+)|')
    out[#out + 1] = prio and ('p' .. prio) or string.format('%d', -tonumber(queue[i + 1]))
    out[#out + 1] = permits
  end
end
return out
