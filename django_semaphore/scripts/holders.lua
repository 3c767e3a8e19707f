-- Live holders in token order (the order they were granted in):
-- {now_ms, id, expiry_ms, record, slots, permits, id, ...}
-- (slots: "3,5", '' without SLOTS and for the variants; permits: 1 for the variants).
-- ARGV[1]: the client's now in ms for the variants that write expiries on the
-- client's clock ('' : the server's TIME): an entry is judged by the clock that wrote it.
-- A timeouts entry without a record (a seed variant's caller between its two
-- round trips, not granted yet) is no holder.
local now
if ARGV[1] and ARGV[1] ~= '' then now = tonumber(ARGV[1]) else now = server_ms() end
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
local found = {}
for i = 1, #live, 2 do
  local id = live[i]
  local rec = redis.call('HMGET', KEYS[3], id, '@' .. id, '*' .. id)
  if rec[1] then
    -- Tokens are decimal strings of up to 20 digits: shorter is smaller.
    local token = string.match(rec[1], '^(%d+):') or ''
    found[#found + 1] = {token, id, tonumber(live[i + 1]), rec}
  end
end
table.sort(found, function(a, b)
  if #a[1] ~= #b[1] then return #a[1] < #b[1] end
  if a[1] ~= b[1] then return a[1] < b[1] end
  return a[2] < b[2]
end)
local out = {now}
for _, h in ipairs(found) do
  out[#out + 1] = h[2]
  out[#out + 1] = h[3]
  out[#out + 1] = h[4][1]
  out[#out + 1] = h[4][2] or ''
  out[#out + 1] = permits_of(h[4][3])
end
return out
