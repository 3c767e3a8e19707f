-- Live holders in owner (token) order:
-- {now_ms, id, expiry_ms, record, slots, permits, id, ...}
-- (slots: "3,5", '' without SLOTS and for the variants; permits: 1 for the variants).
-- ARGV[1]: the client's now in ms for the variants that write expiries on the
-- client's clock ('' : the server's TIME): an entry is judged by the clock that wrote it.
local now
if ARGV[1] and ARGV[1] ~= '' then now = tonumber(ARGV[1]) else now = server_ms() end
local out = {now}
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local expiry = redis.call('ZSCORE', KEYS[1], id)
  if expiry and tonumber(expiry) > now then
    local rec = redis.call('HMGET', KEYS[3], id, '@' .. id, '*' .. id)
    local permits = permits_of(rec[3])
    out[#out + 1] = id
    out[#out + 1] = tonumber(expiry)
    out[#out + 1] = rec[1] or ''
    out[#out + 1] = rec[2] or ''
    out[#out + 1] = permits
  end
end
return out
