-- Set or clear one semaphore's runtime override, merged atomically.
-- KEYS[1]: the control HASH (semaphore name -> JSON; no TTL: configuration).
-- ARGV: name, 'set' | 'clear', limit ('' keeps the stored one), mode ('' keeps
-- the stored one), when (epoch ms), by (who).
-- Returns the stored JSON after the change, or false when nothing is overridden.
local name = ARGV[1]
if ARGV[2] == 'clear' then
  redis.call('HDEL', KEYS[1], name)
  return false
end
local limit, mode = nil, nil
local raw = redis.call('HGET', KEYS[1], name)
if raw then
  local ok, old = pcall(cjson.decode, raw)
  if ok and type(old) == 'table' then
    if type(old['limit']) == 'number' then limit = old['limit'] end
    if type(old['mode']) == 'string' then mode = old['mode'] end
  end
end
if ARGV[3] ~= '' then limit = tonumber(ARGV[3]) end
if ARGV[4] ~= '' then mode = ARGV[4] end
local parts = {}
if limit then parts[#parts + 1] = '"limit":' .. string.format('%d', limit) else parts[#parts + 1] = '"limit":null' end
if mode then parts[#parts + 1] = '"mode":' .. cjson.encode(mode) else parts[#parts + 1] = '"mode":null' end
parts[#parts + 1] = '"at":' .. string.format('%d', tonumber(ARGV[5]))
parts[#parts + 1] = '"by":' .. cjson.encode(ARGV[6])
local value = '{' .. table.concat(parts, ',') .. '}'
redis.call('HSET', KEYS[1], name, value)
return value
