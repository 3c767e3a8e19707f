-- The waiters of one partition in serving order (priority, then ticket), with live tickets only:
-- {now_ms, id, ticket number, record, priority, permits, ...}
-- (record: "ticket:permits:meta json").
local now = server_ms()
local out = {now}
local queue = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
for i = 1, #queue, 2 do
  local member = queue[i]
  local deadline = redis.call('ZSCORE', KEYS[5], member)
  if deadline and tonumber(deadline) > now then
    local id, permits, number = member_parts(member)
    out[#out + 1] = id
    out[#out + 1] = number
    out[#out + 1] = redis.call('HGET', KEYS[6], id) or ''
    out[#out + 1] = string.format('%d', -tonumber(queue[i + 1]))
    out[#out + 1] = permits
  end
end
return out
