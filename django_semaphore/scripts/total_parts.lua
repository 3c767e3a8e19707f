-- The partitions of a name with TOTAL that hold permits or have waiters:
-- {part, ...} (key hashes), from the holds HASH's "c/" fields and the ready ZSET.
local seen = {}
local out = {}
local function add(part)
  if part and not seen[part] then
    seen[part] = true
    out[#out + 1] = part
  end
end
for _, field in ipairs(redis.call('HKEYS', KEYS[3])) do add(string.match(field, '^c/(.+)$')) end
for _, entry in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do add(string.match(entry, '|([^|]*)$')) end
return out
