-- Live holders, in expiry order (inspection.holders orders them by token):
-- {now_ms, id, expiry_ms, record, slots, permits, id, ...}
-- (slots: "3,5", '' without SLOTS and for the variants; permits: 1 for the variants).
-- ARGV[1]: the client's now in ms for the variants that write expiries on the
-- client's clock ('' : the server's TIME): an entry is judged by the clock that wrote it.
-- A timeouts entry without a record (a seed variant's caller between its two
-- round trips, not granted yet) is no holder.
local now
if ARGV[1] and ARGV[1] ~= '' then now = tonumber(ARGV[1]) else now = server_ms() end
local out = {now}
-- (Below +inf: the members of score +inf stand for weighted holders' other permits.)
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '(+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  local id = live[i]
  local rec = redis.call('HMGET', KEYS[3], id, '@' .. id, '*' .. id)
  if rec[1] then
    out[#out + 1] = id
    out[#out + 1] = tonumber(live[i + 1])
    out[#out + 1] = rec[1]
    out[#out + 1] = rec[2] or ''
    out[#out + 1] = permits_of(tag_of(rec[1], rec[3]))
  end
end
return out
