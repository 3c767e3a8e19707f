-- Set or clear one semaphore's runtime override, merged atomically.
-- KEYS[1]: the control HASH (semaphore name -> JSON; no TTL: configuration).
-- ARGV: name, 'set' | 'clear', limit ('' keeps the stored one), mode ('' keeps
-- the stored one), when (epoch ms), by (who), the largest limit (MAX_LIMIT),
-- total ('' keeps the stored one).
-- Returns the stored JSON after the change, or false when nothing is overridden.
-- A limit or total out of 0..MAX_LIMIT is refused (an error, nothing written):
-- Lua's numbers are doubles, and '%d' of one past 2^63 would store -2^63. A
-- stored limit or total out of range (written by hand or by an older version)
-- is clamped to the nearest bound as it is merged, as the Python reader clamps
-- it: never dropped.
local name = ARGV[1]
if ARGV[2] == 'clear' then
  redis.call('HDEL', KEYS[1], name)
  return false
end
local max_limit = tonumber(ARGV[7])
local function given(arg, what)
  if arg == nil or arg == '' then return nil end
  local n = string.match(arg, '^%d+$') and tonumber(arg)
  if not n or n > max_limit then
    return nil, redis.error_reply('ERR ' .. what .. ' must be a whole number from 0 to ' .. max_limit .. ', not ' .. string.sub(arg, 1, 40))
  end
  return n
end
local function clamped(stored)
  if stored ~= stored then return 0 end  -- NaN
  return math.floor(math.max(0, math.min(max_limit, stored)))
end
local limit, err = given(ARGV[3], 'limit')
if err then return err end
local total
total, err = given(ARGV[8], 'total')
if err then return err end
local mode = nil
if ARGV[4] ~= '' then mode = ARGV[4] end
local raw = redis.call('HGET', KEYS[1], name)
if raw then
  local ok, old = pcall(cjson.decode, raw)
  if ok and type(old) == 'table' then
    if limit == nil and type(old['limit']) == 'number' then limit = clamped(old['limit']) end
    if total == nil and type(old['total']) == 'number' then total = clamped(old['total']) end
    if mode == nil and type(old['mode']) == 'string' then mode = old['mode'] end
  end
end
local parts = {}
if limit then parts[#parts + 1] = '"limit":' .. string.format('%d', limit) else parts[#parts + 1] = '"limit":null' end
if mode then parts[#parts + 1] = '"mode":' .. cjson.encode(mode) else parts[#parts + 1] = '"mode":null' end
if total then parts[#parts + 1] = '"total":' .. string.format('%d', total) else parts[#parts + 1] = '"total":null' end
parts[#parts + 1] = '"at":' .. string.format('%d', tonumber(ARGV[5]))
parts[#parts + 1] = '"by":' .. cjson.encode(ARGV[6])
local value = '{' .. table.concat(parts, ',') .. '}'
redis.call('HSET', KEYS[1], name, value)
return value
