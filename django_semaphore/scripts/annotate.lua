-- Add fields to a live holder's meta, the JSON after "token:acquired_ms:" in
-- the holds HASH (KEYS[1]). ARGV: identifier, JSON object of the fields.
-- 0: not held.
local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then return 0 end
local at = string.find(record, '{', 1, true)
if not at then return 0 end
local ok, meta = pcall(cjson.decode, string.sub(record, at))
if not ok or type(meta) ~= 'table' then meta = {} end
for k, v in pairs(cjson.decode(ARGV[2])) do meta[k] = v end
redis.call('HSET', KEYS[1], ARGV[1], string.sub(record, 1, at - 1) .. cjson.encode(meta))
return 1
