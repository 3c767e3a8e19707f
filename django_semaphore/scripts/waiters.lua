-- The waiters of one partition in serving order (ticket order), with live tickets only:
-- {now_ms, id, ticket number, meta json, id, ticket number, meta json, ...}.
local now = server_ms()
local out = {now}
local queue = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
for i = 1, #queue, 2 do
  local id = queue[i]
  local deadline = redis.call('ZSCORE', KEYS[5], id)
  if deadline and tonumber(deadline) > now then
    out[#out + 1] = id
    out[#out + 1] = queue[i + 1]
    out[#out + 1] = redis.call('HGET', KEYS[6], id) or ''
  end
end
return out
