-- Read-only figures of one partition: {now_ms, live holders, waiters, earliest expiry ms or -1}.
local now = server_ms()
local live = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
local waiting = redis.call('ZCOUNT', KEYS[5], '(' .. now, '+inf')
local first = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local earliest = -1
if first[2] then earliest = tonumber(first[2]) end
return {now, live, waiting, earliest}
