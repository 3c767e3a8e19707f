-- Read-only figures of one partition: {now_ms, live holders, waiters, earliest expiry ms or -1}.
-- ARGV[1]: the client's now in ms for the variants that write expiries on the
-- client's clock ('' : the server's TIME). Each entry is judged by the clock
-- that wrote it: holders by that one, waiter tickets (server time) by TIME.
local server = server_ms()
local now = server
if ARGV[1] and ARGV[1] ~= '' then now = tonumber(ARGV[1]) end
local live = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
local waiting = redis.call('ZCOUNT', KEYS[5], '(' .. server, '+inf')
local first = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local earliest = -1
if first[2] then earliest = tonumber(first[2]) end
return {now, live, waiting, earliest}
