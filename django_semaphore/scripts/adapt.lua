-- The adaptive limit (django_semaphore.adaptive): add one process's window of
-- hold times to the semaphore's shared window and, at most once per INTERVAL
-- (server time), run the control law on it, atomically.
-- KEYS[1]: the control HASH. The semaphore's override is field `name`; the
-- controller's state is field '\255a:' .. name (the byte 0xFF is never in a
-- semaphore name sent as UTF-8), JSON {"limit", "base" (ms, 0: none),
-- "mean" (ms, the last window's), "dir" (-1, 0, 1: the last update's change),
-- "at" (server ms of the last update), "sum" (ms), "n", "p" (the window
-- accumulated since "at"), "settle" (1: drop that window, the one after a change),
-- "probe" (1: the limit is held at the probe limit to measure the baseline),
-- "saved" (the limit to go back to after the probe), "next" (server ms of the
-- next periodic probe)}.
-- ARGV: name, sum of hold ms, holds, pressure (acquires refused or queued),
-- MIN, MAX, INTERVAL ms, TOLERANCE, MIN_SAMPLES, LIMIT (the starting point),
-- PROBE_INTERVAL ms (0: probe only when the baseline is in doubt), probe limit.
-- Returns {status, limit, base ms, mean ms} (strings: Redis truncates Lua
-- numbers); status: 'updated', 'interval' (not due yet), 'samples' (fewer
-- than MIN_SAMPLES holds), 'settling' (the window after a change, dropped),
-- 'probe' (a probe starts: the limit drops to the probe limit), 'probed' (the
-- probe measured the baseline; the limit is back), 'override' (a limit
-- override is in force: the window is dropped, the limit stays).
local name = ARGV[1]
local sum, n, pressure = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local lo, hi = tonumber(ARGV[5]), tonumber(ARGV[6])
local interval, tolerance, min_samples = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local probe_every = tonumber(ARGV[11] or '') or 60000
local probe_limit = math.max(lo, math.min(hi, tonumber(ARGV[12] or '') or 3))
local field = '\255a:' .. name

local function clamp(x)
  return math.max(lo, math.min(hi, x))
end

local now = server_ms()
local state = nil
local raw = redis.call('HGET', KEYS[1], field)
if raw then
  local ok, decoded = pcall(cjson.decode, raw)
  if ok and type(decoded) == 'table' and type(decoded['limit']) == 'number' then state = decoded end
end
if state == nil then
  state = {limit = tonumber(ARGV[10]), base = 0, mean = 0, dir = 0, at = now, sum = 0, n = 0, p = 0, settle = 0,
           probe = 0, saved = 0, next = 0}
end
for _, k in ipairs({'base', 'mean', 'dir', 'at', 'sum', 'n', 'p', 'settle', 'probe', 'saved', 'next'}) do
  if type(state[k]) ~= 'number' then state[k] = 0 end
end
state['limit'] = clamp(math.floor(state['limit']))

local function reply(status)
  redis.call('HSET', KEYS[1], field, cjson.encode(state))
  return {status, tostring(state['limit']), tostring(state['base']), tostring(state['mean'])}
end

-- A limit override is in force: the controller does not move, and what was
-- measured under the override's limit says nothing about its own.
local override = redis.call('HGET', KEYS[1], name)
if override then
  local ok, decoded = pcall(cjson.decode, override)
  if ok and type(decoded) == 'table' and type(decoded['limit']) == 'number' then
    state['sum'], state['n'], state['p'], state['at'] = 0, 0, 0, now
    return reply('override')
  end
end

state['sum'] = state['sum'] + sum
state['n'] = state['n'] + n
state['p'] = state['p'] + pressure
if now - state['at'] < interval then return reply('interval') end
if state['settle'] == 1 then
  -- The window after a change mixes holds taken under the old limit (every
  -- process applies a change within a poll, and holds started before end
  -- after): dropped, so that the next update judges the new limit alone.
  state['sum'], state['n'], state['p'], state['at'], state['settle'] = 0, 0, 0, now, 0
  return reply('settling')
end
if state['n'] < min_samples then return reply('samples') end

local limit = state['limit']
local s = math.max(state['sum'] / state['n'], 0.001)

local function finish(new, base, status)
  new = clamp(new)
  if new > limit then state['dir'] = 1 elseif new < limit then state['dir'] = -1 else state['dir'] = 0 end
  if new ~= limit then state['settle'] = 1 end
  state['limit'], state['base'], state['mean'], state['at'] = new, base, s, now
  state['sum'], state['n'], state['p'] = 0, 0, 0
  return reply(status)
end

-- The baseline: the mean hold at a concurrency low enough not to load the
-- resource. A probe holds the limit at the probe limit for one window (after
-- its settling window) and takes that window's mean as the baseline, then
-- puts the limit back. Probes run when there is no baseline yet, every
-- PROBE_INTERVAL, and when the last decrease did not shorten the holds (the
-- resource may have got slower at every load: the baseline is in doubt).
if state['probe'] == 1 then
  state['probe'], state['next'] = 0, now + probe_every
  return finish(math.max(state['saved'], lo), s, 'probed')
end
local doubt = state['dir'] < 0 and s >= 0.95 * state['mean']
local periodic = probe_every > 0 and state['next'] > 0 and now >= state['next']
if state['base'] <= 0 or doubt or periodic then
  if limit <= probe_limit then
    -- Already at or below the probe limit: this window is the measurement.
    state['next'] = now + probe_every
    return finish(limit, s, 'probed')
  end
  state['probe'], state['saved'] = 1, limit
  return finish(probe_limit, state['base'], 'probe')
end

-- The control law, on the window's mean hold S against the baseline B (the
-- lowest of the probe's and of the windows' since: a shorter mean hold is
-- as uncontended as the probe's).
local base = math.min(state['base'], s)
local r = s / base
local new = limit
if r > tolerance then
  new = math.max(lo, math.floor(limit / 2), math.floor(limit * tolerance / r))
  if new >= limit then new = limit - 1 end
elseif state['p'] > 0 then
  if r <= 1 + (tolerance - 1) / 2 then
    new = limit + math.max(1, math.floor(math.sqrt(limit)))
  else
    new = limit + 1
  end
end
return finish(new, base, 'updated')
