-- Shared prelude, prepended to every script.
-- KEYS[1] timeouts ZSET (id -> expiry ms; a holder of 2 to MEMBERS_MAX
--         permits also has its other permits as members id .. '#2' to
--         id .. '#n' of score +inf, which leave with its entry),
-- KEYS[2] owners ZSET (id -> token): the seed variants' only; the "lua"
--         engine keeps each holder's token in its record and leaves this key
--         unwritten (one call less per acquire and per release). For a name
--         with TOTAL it is the ready ZSET instead (see below),
-- KEYS[3] holds HASH: id -> "token:acquired_ms:" .. tag .. meta (the holder's
--                record; meta: a JSON object, so it starts with "{"; tag:
--                the holder's permits when more than one, "m" .. n for n of
--                them, those beyond the first being timeouts members, or the
--                number itself, those beyond the first counted in "+"),
--         "*" .. id -> that tag, for a holder granted by an earlier version
--                (read, never written: see tag_of),
--         "@" .. id -> the holder's slot numbers "3,5", or runs "0-9999,10002" (SLOTS only),
--         "#" -> the fair counter (absent: the HASH was just (re)created),
--         "+" -> the permits beyond the first of the holders of more than
--                MEMBERS_MAX (permits held = ZCARD of the timeouts ZSET + this),
--         "w" -> "1" while the queue may hold waiters (absent: it holds none,
--                so the common acquire and release never look at the queue),
--         "e" -> the TTL watermark: KEYS[1], KEYS[3] and KEYS[7]
--                live at least until this server time (ms),
--         "%" -> recent hold times, see record_hold,
--         "r" -> when a caller was last refused (server ms): releases record
--                their hold times for SAMPLE_MS after it (see HOLD_FIRST),
--         "~" -> TABLE_NOTE, written with the first grant: keeps the HASH a
--                hash table (see TABLE_FIELD),
-- KEYS[4] queue ZSET (member "ticket:permits:id" -> -priority: ZRANGE is the
--         serving order, priority first, then the ticket number: members of
--         one score sort as strings, and ticket numbers all have the same
--         number of digits (server microseconds: 16 until the year 2286)),
-- KEYS[5] queue deadlines ZSET (the same members -> ms),
-- KEYS[6] waiters HASH (waiter id -> "ticket:permits:meta json", while it is queued;
--         "e" -> the queue keys' TTL watermark: KEYS[4], KEYS[5] and KEYS[6]
--         live at least until this server time (ms); see acquire.lua),
-- KEYS[7] slots bitmap (SLOTS only: bit n set while a holder has slot n;
--         BITPOS finds free slots in O(LIMIT / 64)),
-- KEYS[8] (acquire of a waiter, abandon) the caller's own wake-up LIST.
--
-- A name with TOTAL keeps one set of these keys for all its partitions (they
-- share one hash slot), so that one script sees the whole name:
-- * a holder's or waiter's identifier starts with its partition, "part/...";
-- * holds HASH "c/" .. part -> the permits the partition's holders hold,
--   "s/" .. part -> the token of its last grant (while it holds permits);
-- * queue members are "part|prio|ticket:permits:id", all of score 0, so that
--   a partition's waiters are one lexical range in serving order (prio: 17
--   digits, lower for a higher priority);
-- * waiters HASH "@" .. id -> the slots flag ("1" or "") .. "|" .. prio,
--   "p/" .. part -> the partition's member of the ready ZSET;
-- * KEYS[2], the ready ZSET: one member per partition with waiters,
--   "prio|served|ticket|part" of its first waiter, all of score 0: the lexical
--   order is the serving order between partitions (priority first, then the
--   partition served least recently: "served" is the token of its last grant,
--   17 digits, 0 for none; then its first waiter's arrival).
-- A script touches no other key: the wake-up lists of other waiters are
-- pushed afterwards by wake.lua, to which the caller passes the identifiers
-- (and the TTL) a script returned (Redis Cluster wants every key declared).
--
-- A TTL that a holder or waiter relies on is only ever lengthened: processes
-- may disagree on TIMEOUT (a rolling deploy that changes it), and a
-- short-TIMEOUT process must not cut the TTL of a longer one's keys. A key
-- that may have been (re)created always gets a TTL in the same script.

-- A woken waiter has this long to come back and take its slot: a live one
-- does within milliseconds; a dead one is then dropped from the queue instead
-- of holding up the waiters behind it until its ticket runs out.
local CLAIM_MS = 500
-- A grant names the waiters its holder's release is likely to serve only when
-- LIMIT is at most this (see grant_first): reading further costs every release.
local GUESS_MAX = 16
-- Recent hold times, packed in one integer field of the holds HASH so that a
-- release records one with a single HINCRBY: sum of the holds in ms x SCALE +
-- their number. Both halve when the number reaches SAMPLES (older holds weigh
-- less and less), which keeps the number below SCALE and the sum exact.
local HOLDS_FIELD = '%'
local HOLD_SCALE = 1024
local HOLD_SAMPLES = 32
local HOLD_MAX_MS = 2147483647  -- longer holds count as this: 32 x 2^31 x 1024 < 2^53
-- A release records every hold until this many are recorded; after that,
-- only while its hold times are needed: while callers wait, and for
-- SAMPLE_MS after a caller was refused (field REFUSED_FIELD: when, server ms).
-- Only a refused caller is told a Retry-After estimate, so a partition that
-- never runs full records nothing more (no extra call per release).
local HOLD_FIRST = 8
local REFUSED_FIELD = 'r'
local SAMPLE_MS = 60000
-- A refusal writes REFUSED_FIELD only when it is this much older (ms): a
-- full semaphore refuses many callers a second, one write does for them.
local REFUSED_EVERY = 1000
-- A holder of up to this many permits keeps those beyond its first as
-- members of the timeouts ZSET, so that its release is plain commands (a ZREM
-- of them all: no key can be created without its TTL, see Lua.release); one
-- of more adds them to the "+" count, which costs the same for any weight and
-- is only written by scripts (a HINCRBY on a HASH that expired would create
-- it without a TTL). Measured against a plain cycle's server time: 2 permits
-- as members 1.06 x, 8 1.25 to 1.38 x, 16 1.61 x; 16 by the count and
-- release.lua 1.60 x: the members stop paying off at about 16.
local MEMBERS_MAX = 8

-- The holds HASH gets, with its first grant, a field whose value is longer
-- than Redis's listpack limit for a hash (hash-max-listpack-value, 64 bytes
-- by default): Redis then keeps the HASH a hash table for the rest of its
-- life. Packed as a listpack (up to 128 fields of short values), every
-- HMGET, HSET and HDEL scans the fields one by one, a missing field all of
-- them, and the common acquire and release read three fields that are
-- usually missing: with 10 holders the scans took more of the server's
-- instructions than a hash table's lookups (see docs/redis-cost.rst).
local TABLE_FIELD = '~'
local TABLE_NOTE = 'a hash table, not a listpack: one lookup per field, not a scan of them all'

-- The number of holds in the packed "%" field (false/nil: none).
local function hold_count(packed)
  return (tonumber(packed or '') or 0) % HOLD_SCALE
end

local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end

-- Give `key` a TTL of at least `ttl` ms; never shorten a longer one, and set
-- one on a key that has none (PTTL -1: just created).
local function lengthen(key, ttl)
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
end

-- Push `grant` to a waiter's wake-up list `key`, which lives at least `ttl`
-- ms: a list created by the push gets it at once (no PTTL), one that existed
-- (an unread wake-up in it) keeps a longer TTL of its own.
local function push_grant(key, grant, ttl)
  if redis.call('RPUSH', key, grant) == 1 then
    redis.call('PEXPIRE', key, ttl)
  else
    lengthen(key, ttl)
  end
end

-- Slot numbers taken or given back in one go rather than a SETBIT each, from
-- this many on: the bitmap's bytes are read (GETRANGE), changed in Lua and
-- written back (SETRANGE), a few calls for any number of slots. Their stored
-- form then names runs of consecutive numbers by their ends ("0-9999,10002"),
-- so that neither its length nor its parsing grows with the permits.
local SLOTS_BULK = 8

-- Bit n of the bitmap is the bit 128 >> n % 8 of byte n // 8, as SETBIT counts.
-- Clear bits `a` to `b` in `t` (the bitmap's byte values from byte `first` on).
local function clear_run(t, first, a, b)
  local function clear(n)
    local i = math.floor(n / 8) - first + 1
    if t[i] then t[i] = bit.band(t[i], bit.bnot(bit.rshift(128, n % 8))) end
  end
  local whole_from, whole_to = math.ceil(a / 8), math.floor((b + 1) / 8) - 1
  if whole_from > whole_to then
    for n = a, b do clear(n) end
    return
  end
  for n = a, whole_from * 8 - 1 do clear(n) end
  for i = whole_from - first + 1, math.min(whole_to - first + 1, #t) do t[i] = 0 end
  for n = (whole_to + 1) * 8, b do clear(n) end
end

-- Give the slots "3,5" (or "0-9999,10002": runs) back to the bitmap, which exists.
local function free_slots(slots)
  local runs, count, lo, hi = {}, 0, math.huge, -1
  for a, b in string.gmatch(slots, '(%d+)%-?(%d*)') do
    a = tonumber(a)
    b = tonumber(b) or a
    runs[#runs + 1] = {a, b}
    count = count + b - a + 1
    if a < lo then lo = a end
    if b > hi then hi = b end
  end
  if #runs == 0 then return end
  local first, last = math.floor(lo / 8), math.floor(hi / 8)
  if count < SLOTS_BULK or last - first + 1 > 4 * count then
    for _, run in ipairs(runs) do
      for n = run[1], run[2] do redis.call('SETBIT', KEYS[7], n, 0) end
    end
    return
  end
  local bytes = redis.call('GETRANGE', KEYS[7], first, last)
  local t, chars = {}, {}
  for i = 1, #bytes, 4096 do  -- (unpack's stack: 4096 at a time)
    local j = math.min(i + 4095, #bytes)
    local part = {string.byte(bytes, i, j)}
    for k = 1, #part do t[i + k - 1] = part[k] end
  end
  for _, run in ipairs(runs) do clear_run(t, first, run[1], run[2]) end
  for i = 1, #t, 4096 do chars[#chars + 1] = string.char(unpack(t, i, math.min(i + 4095, #t))) end
  redis.call('SETRANGE', KEYS[7], first, table.concat(chars))
end

-- Take the `permits` lowest free slot numbers in the bitmap (created if
-- missing); they are returned in their stored form ("3,5", or runs).
local function take_slots(permits)
  local pos = redis.call('BITPOS', KEYS[7], 0)
  if permits < SLOTS_BULK then
    -- BITPOS from the byte of the last slot taken: O(LIMIT / 64) in all.
    redis.call('SETBIT', KEYS[7], pos, 1)
    if permits == 1 then return tostring(pos) end
    local list = {pos}
    for i = 2, permits do
      pos = redis.call('BITPOS', KEYS[7], 0, math.floor(pos / 8))
      redis.call('SETBIT', KEYS[7], pos, 1)
      list[i] = pos
    end
    return table.concat(list, ',')
  end
  -- The bytes from the first free slot's on, read a chunk at a time until
  -- enough free bits are found or the string ends (every bit past its end is
  -- free), then written back at once.
  local start = math.floor(pos / 8)
  local at, chunk = start, math.max(64, math.ceil(permits / 8) + 1)
  local runs, n, written = {}, 0, {}
  local function add(a, b)  -- numbers a..b taken
    local last = runs[#runs]
    if last and last[2] == a - 1 then last[2] = b else runs[#runs + 1] = {a, b} end
    n = n + b - a + 1
  end
  while n < permits do
    local bytes = redis.call('GETRANGE', KEYS[7], at, at + chunk - 1)
    for i = 1, #bytes do
      local b = string.byte(bytes, i)
      local base = (at + i - 1) * 8
      if b == 0 and permits - n >= 8 then
        add(base, base + 7)
        b = 255
      elseif b ~= 255 then
        for k = 0, 7 do
          local mask = bit.rshift(128, k)
          if bit.band(b, mask) == 0 then
            add(base + k, base + k)
            b = bit.bor(b, mask)
            if n == permits then break end
          end
        end
      end
      written[#written + 1] = string.char(b)
      if n == permits then break end
    end
    at = at + #bytes
    if #bytes < chunk then break end
  end
  if n < permits then
    -- Past the string's end: one run, whole bytes of ones and the first bits
    -- of one more.
    local more = permits - n
    add(at * 8, at * 8 + more - 1)
    written[#written + 1] = string.rep(string.char(255), math.floor(more / 8))
    if more % 8 > 0 then written[#written + 1] = string.char(256 - 2 ^ (8 - more % 8)) end
  end
  redis.call('SETRANGE', KEYS[7], start, table.concat(written))
  local parts = {}
  for i, run in ipairs(runs) do
    parts[i] = run[1] == run[2] and tostring(run[1]) or run[1] .. '-' .. run[2]
  end
  return table.concat(parts, ',')
end

-- The permits tag of a holder from its record and its "*" field (nil: one
-- permit). The tag is in the record, between the acquired time and the meta
-- JSON: no field more to write, read or delete per weighted holder. A holder
-- granted by an earlier version kept it in a "*" field instead, which
-- scripts still read (and delete with the record).
-- (Plain finds, not a pattern: string.match's backtracking over the digits
-- cost a release about 3,700 server instructions.)
local function tag_of(record, field)
  if field or not record then return field end
  local first = string.find(record, ':', 1, true)
  local second = first and string.find(record, ':', first + 1, true)
  if not second or second == #record then return nil end
  local meta = string.find(record, '{', second + 1, true)
  if meta == second + 1 then return nil end
  return string.sub(record, second + 1, (meta or 0) - 1)
end

-- A holder's permits from its tag (nil: one; "m3": three, two of them as
-- timeouts members; "20": twenty, nineteen of them in the "+" count).
local function permits_of(field)
  if not field then return 1 end
  return tonumber(field) or tonumber(string.sub(field, 2)) or 1
end

-- The timeouts members of holder `id`'s permits `k` to `permits` (2 <= k,
-- permits <= MEMBERS_MAX < 10), each after `score` if given, as values: for
-- so few, cheaper than a table and unpack() (2 permits: 0.2 against 0.5 us),
-- and string.char() costs less than a number in a concatenation (a sprintf).
local function members_from(k, id, permits, score)
  if k > permits then return end
  local member = id .. '#' .. string.char(48 + k)
  if score then return score, member, members_from(k + 1, id, permits, score) end
  return member, members_from(k + 1, id, permits, score)
end

-- Add (`score`: '+inf') or remove (`score`: nil) the members of holder `id`'s
-- permits beyond its first.
local function set_members(id, permits, score)
  redis.call(score and 'ZADD' or 'ZREM', KEYS[1], members_from(2, id, permits, score))
end

-- Give back the permits beyond the first of holder `id`, whose tag is
-- `field`: its members ("m" .. n), else the number for the "+" count,
-- returned (a holder of more than MEMBERS_MAX; or one granted by a version
-- that counted every weight there).
local function give_back(id, field)
  local permits = permits_of(field)
  if permits > 1 and string.sub(field, 1, 1) == 'm' then
    set_members(id, permits, nil)
    return 0
  end
  return permits - 1
end

-- give_back for one holder, lowering the "+" count by what it returns
-- (returned: 0 when the count is unchanged).
local function give_back_one(id, field)
  local extra = give_back(id, field)
  if extra > 0 then redis.call('HINCRBY', KEYS[3], '+', -extra) end
  return extra
end

-- Forget the records of the holders `ids` (at most 1000): their permits
-- beyond the first leave the timeouts ZSET or the "+" count, their slots go back to the bitmap
-- (if it still exists: SETBIT would create it without a TTL).
local function drop_records(ids)
  local fields = {}
  for i, id in ipairs(ids) do
    fields[3 * i - 2] = id
    fields[3 * i - 1] = '*' .. id
    fields[3 * i] = '@' .. id
  end
  local found = redis.call('HMGET', KEYS[3], unpack(fields))
  local extra = 0
  local exists = nil
  local parts = nil  -- TOTAL: permits given back per partition
  for i = 1, #ids do
    local tag = tag_of(found[3 * i - 2], found[3 * i - 1])
    local permits = permits_of(tag)
    extra = extra + give_back(ids[i], tag)
    if found[3 * i] then
      if exists == nil then exists = redis.call('EXISTS', KEYS[7]) == 1 end
      if exists then free_slots(found[3 * i]) end
    end
    local part = string.match(ids[i], '^([^/]+)/')
    if part then
      parts = parts or {}
      parts[part] = (parts[part] or 0) + permits
    end
  end
  if extra > 0 then redis.call('HINCRBY', KEYS[3], '+', -extra) end
  if parts then
    for part, permits in pairs(parts) do
      if redis.call('HINCRBY', KEYS[3], 'c/' .. part, -permits) <= 0 then
        redis.call('HDEL', KEYS[3], 'c/' .. part, 's/' .. part)
      end
    end
  end
  redis.call('HDEL', KEYS[3], unpack(fields))
end

-- drop_records for one holder, `id` (refresh of a lost lease, an expired
-- entry replaced).
local function drop_record(id)
  drop_records({id})
end

-- The holder keys (KEYS[1], KEYS[3], KEYS[7]) outlive the latest
-- expiry they hold by one second: the "e" field of the holds HASH says until
-- when they live at least (an absolute server time), so the common call reads
-- it with the rest and writes nothing. When a new expiry would outlive it, the
-- watermark moves to that expiry + 1 s + one lease more (so this happens about
-- once per lease, and a partition nobody uses is gone within 2 x lease + 1 s)
-- and the three keys get it with PEXPIREAT, which never shortens a TTL set the
-- same way (the watermark only grows while the HASH lives) and works on Redis 6.2.
-- `watermark`: the "e" read (nil: the HASH was just (re)created, so the other
-- keys' TTLs are not known: the new one is at least the longest of them).
-- Returns the new watermark, or nil when the keys live long enough.
-- `keys`: the keys it is for (default: the holder keys; the queue keys keep
-- theirs the same way, see acquire.lua).
local function next_watermark(now, expires, lease, watermark, keys)
  local need = expires + 1000
  if watermark and watermark >= need then return nil end
  local target = need + lease
  if watermark then return math.max(target, watermark) end
  for _, key in ipairs(keys or {KEYS[1], KEYS[3], KEYS[7]}) do
    local ttl = redis.call('PTTL', key)
    if ttl > 0 and now + ttl > target then target = now + ttl end
  end
  return target
end

-- Give the holder keys (or `keys`) the watermark `at` (after the HASH that
-- keeps it was written).
local function keep_until(at, keys)
  for _, key in ipairs(keys or {KEYS[1], KEYS[3], KEYS[7]}) do redis.call('PEXPIREAT', key, at) end
end

-- A refusal: the holds HASH (`exists`: it does; a write would create it
-- without a TTL) says when, at most once a REFUSED_EVERY (`last`: its
-- REFUSED_FIELD as read, false or nil: none).
local function mark_refused(now, exists, last)
  if exists and not (last and now - tonumber(last) < REFUSED_EVERY) then
    redis.call('HSET', KEYS[3], REFUSED_FIELD, now)
  end
end

-- The partition's state for hold(), read once per script: the holds HASH's
-- fair counter, weighted count and TTL watermark, the timeouts ZSET's
-- members, and whether it is empty (so that the next timeouts entry creates
-- it, without a TTL).
-- `known` (optional): what the caller read already and nothing changed since,
-- each optional: `holders` (the ZCARD of the timeouts ZSET), `head` (the
-- holds HASH's "#", "+" and "e", as HMGET returns them), `leaving` (entries
-- of the timeouts ZSET whose permits are free already: a releasing holder's
-- live entry, removed after the grants so that the ZSET is not deleted and
-- created again without its TTL; release.lua).
local function grant_state(now, clock, known)
  known = known or {}
  local h = known.head or redis.call('HMGET', KEYS[3], '#', '+', 'e')
  local holders = known.holders or redis.call('ZCARD', KEYS[1])
  return {
    counter = h[1], extra = tonumber(h[2] or '') or 0, watermark = tonumber(h[3] or ''),
    fresh = holders == 0, now = now, clock = clock, numbered = false,
    holders = holders - (known.leaving or 0),
  }
end

-- Make `id`, whose timeouts entry (until `expires`, a lease of `lease` ms) is
-- written (and its other permits' members, if `st.members`), a holder of `permits`: its slot numbers when `st.numbered`, its
-- fair token, its record (`meta` json), its permits beyond the first (members
-- or the "+" count) and the keys' TTLs. `st` (grant_state) is kept up to date for the next
-- grant of the same script. Returns the token and the slots ("3,5" or '').
local function hold(st, id, permits, expires, lease, meta)
  local taken = ''
  local new_bitmap = false
  if st.numbered then
    -- The lowest free slot numbers: below the limit in force, since fewer
    -- than `limit` permits are held (slots of holders above a lowered limit
    -- stay theirs).
    new_bitmap = redis.call('EXISTS', KEYS[7]) == 0
    taken = take_slots(permits)
  end
  -- The fair counter: the next token is the larger of the last token + 1
  -- and the server time in microseconds. Tokens keep increasing across idle
  -- periods in which the keys expired, and across a failover to a replica
  -- that had not yet received the last tokens (as long as the servers'
  -- clocks agree to within the failover time). Returned as a string to stay
  -- exact; past 2^53 the server's integer arithmetic takes over.
  local new_hash = not st.counter
  local n = tonumber(st.counter or '') or 0
  local token
  if n >= 9007199254740991 then
    redis.call('HINCRBY', KEYS[3], '#', 1)
    token = redis.call('HGET', KEYS[3], '#')
  else
    local micros = tonumber(st.clock[1]) * 1000000 + tonumber(st.clock[2])
    if micros > n then n = micros else n = n + 1 end
    token = string.format('%.0f', n)
  end
  st.counter = token
  local keep = next_watermark(st.now, expires, lease, st.watermark)
  -- The record carries the permits tag (see tag_of).
  local tag = ''
  local fields = {'#', token, id, false}
  if permits > MEMBERS_MAX then
    st.extra = st.extra + permits - 1
    fields[#fields + 1] = '+'
    fields[#fields + 1] = st.extra
    tag = permits
  elseif permits > 1 then
    if not st.members then set_members(id, permits, '+inf') end
    tag = 'm' .. string.char(48 + permits)
  end
  fields[4] = token .. ':' .. st.now .. ':' .. tag .. meta
  if st.numbered then
    fields[#fields + 1] = '@' .. id
    fields[#fields + 1] = taken
  end
  if st.part then
    -- TOTAL: the partition's permits (st.held: before this grant) and last grant.
    st.held = st.held + permits
    fields[#fields + 1] = 'c/' .. st.part
    fields[#fields + 1] = st.held
    fields[#fields + 1] = 's/' .. st.part
    fields[#fields + 1] = token
  end
  if keep then
    fields[#fields + 1] = 'e'
    fields[#fields + 1] = keep
  end
  if new_hash then
    fields[#fields + 1] = TABLE_FIELD
    fields[#fields + 1] = TABLE_NOTE
  end
  redis.call('HSET', KEYS[3], unpack(fields))
  if keep then
    keep_until(keep)
    st.watermark = keep
  else
    -- The watermark holds: only keys created now lack their TTL.
    if st.fresh then redis.call('PEXPIREAT', KEYS[1], st.watermark) end
    if new_bitmap then redis.call('PEXPIREAT', KEYS[7], st.watermark) end
  end
  st.fresh = false
  return token, taken
end

-- Remove up to `n` (<= 1000) holders whose lease ended at or before `now`; return how many.
-- `owners`: their entries in the owners ZSET go too (purge.lua, which serves
-- the seed variants as well; the "lua" engine writes no owners entries).
local function purge_holders(now, n, owners)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, n)
  if #gone > 0 then
    redis.call('ZREM', KEYS[1], unpack(gone))
    if owners then redis.call('ZREM', KEYS[2], unpack(gone)) end
    drop_records(gone)
  end
  return #gone
end

-- Permits held (expired leases not purged yet included), and the number of
-- timeouts members among them.
local function permits_held()
  local holders = redis.call('ZCARD', KEYS[1])
  return holders + (tonumber(redis.call('HGET', KEYS[3], '+') or '') or 0), holders
end

-- A queue member's parts: identifier, permits, ticket number.
local function member_parts(member)
  local number, permits, id = string.match(member, '^(%d+):(%d+):(.*)$')
  if not number then  -- TOTAL: "part|prio|ticket:permits:id"
    number, permits, id = string.match(member, '^[^|]*|%d+|(%d+):(%d+):(.*)$')
  end
  return id, tonumber(permits), number
end

-- TOTAL: a number as a string of `width` digits (tokens and tickets: 16 digits
-- until the year 2286), so that such strings sort as the numbers do.
local function padded(number, width)
  return string.rep('0', width - #number) .. number
end

-- TOTAL: the first waiter of partition `part` (nil: none), its queue member.
local function part_head(part)
  return redis.call('ZRANGEBYLEX', KEYS[4], '[' .. part .. '|', '(' .. part .. '}', 'LIMIT', 0, 1)[1]
end

-- TOTAL: put partition `part`'s member of the ready ZSET in line with its
-- queue: its first waiter's priority and ticket, and when it was served last
-- (`served`: the token of a grant made now; nil: as its member said, else
-- its last grant's, else never).
local function ready_update(part, served)
  local old = redis.call('HGET', KEYS[6], 'p/' .. part)
  local head = part_head(part)
  local new = nil
  if head then
    if not served and old then served = string.match(old, '^%d+|(%d+)|') end
    if not served then served = redis.call('HGET', KEYS[3], 's/' .. part) or '0' end
    local prio, number = string.match(head, '^[^|]*|(%d+)|(%d+):')
    new = prio .. '|' .. padded(served, 17) .. '|' .. padded(number, 17) .. '|' .. part
  end
  if old == new then return end
  -- The new member first: the ZSET never goes empty on the way, so it keeps its TTL.
  if new then
    redis.call('ZADD', KEYS[2], 0, new)
    redis.call('HSET', KEYS[6], 'p/' .. part, new)
  else
    redis.call('HDEL', KEYS[6], 'p/' .. part)
  end
  if old then redis.call('ZREM', KEYS[2], old) end
end

-- Remove abandoned waiter tickets; return the number of waiters left, and the
-- earliest ticket deadline when nothing was removed (else nil): the first
-- deadline says whether any passed, so that a queue with none costs one read.
local function purge_waiters(now)
  local waiting = redis.call('ZCARD', KEYS[4])
  local soonest = nil
  if waiting > 0 then
    local first = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
    soonest = tonumber(first[2] or '')
    local gone = {}
    if soonest and soonest <= now then
      soonest = nil
      gone = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, 100)
    end
    if #gone > 0 then
      redis.call('ZREM', KEYS[4], unpack(gone))
      redis.call('ZREM', KEYS[5], unpack(gone))
      local fields = {}
      local parts = nil  -- TOTAL: the partitions whose queue changed
      for _, member in ipairs(gone) do
        local id = member_parts(member)
        fields[#fields + 1] = id
        fields[#fields + 1] = '@' .. id
        local part = string.match(member, '^([^|]*)|')
        if part then
          parts = parts or {}
          parts[part] = true
        end
      end
      redis.call('HDEL', KEYS[6], unpack(fields))
      if parts then
        for part in pairs(parts) do ready_update(part) end
      end
      waiting = redis.call('ZCARD', KEYS[4])
    end
  end
  return waiting, soonest
end

-- Direct grant: the first waiters in serving order whose permits fit in the
-- `free` ones together are granted them now (the first that does not fit
-- stops the walk: it blocks those behind it, so a large request is not
-- starved), in queue order, so their tokens follow the queue. Each gets a
-- claim lease of CLAIM_MS: a live waiter turns it into a lease of its own
-- TIMEOUT with its first refresh, within milliseconds; a dead one loses it
-- when it expires, instead of holding up the waiters behind it. Each one
-- granted leaves the queue and gets its grant
-- ("token:acquired_ms:expires_ms:slots:successor") in its wake-up list: pushed
-- here if `push` (a release's: identifier -> wake-up list) holds its list,
-- else appended to `out` with its identifier, for the caller to
-- push (wake.lua), after the TTL for the lists (that of the queue keys,
-- which outlive every waiter's lease, and at least 10 s). `successor`: with
-- `limit` at most GUESS_MAX, the waiters its holder's release is likely to
-- serve, comma-separated: the one `limit` places behind it in the queue (with
-- equal holds, exactly that one) and, with LIMIT > 1, the ones just before and
-- after it (the other holders' releases, one per holder as a rule, may come
-- one more or one fewer before its own); that release names their lists and
-- pushes the grant of the one it serves in the same script ('' when the queue
-- is shorter). At most `free` + GUESS_MAX + 1 members are read. `st`:
-- grant_state's, read by the caller. Returns how many waiters left the queue.
local function grant_first(st, free, out, limit, push)
  local now = st.now
  local first = #out + 1
  local left = 0
  local taken = 0
  local ttl = nil
  local behind = limit <= GUESS_MAX and limit or 0
  local spread = behind > 1 and 1 or 0
  local members = redis.call('ZRANGE', KEYS[4], 0, free - 1 + behind + spread)
  for i, w in ipairs(members) do
    if i > free then break end
    local id, permits = member_parts(w)
    taken = taken + permits
    if taken > free then break end
    local rec = redis.call('HMGET', KEYS[6], id, '@' .. id, 'e')
    if not ttl then
      -- The queue keys' watermark (acquire.lua) when there is one: no PTTL.
      local mark = tonumber(rec[3] or '')
      ttl = math.max(10000, mark and mark - now or redis.call('PTTL', KEYS[5]))
    end
    local meta = rec[1] and string.match(rec[1], '^%d+:%d+:(.*)$') or '{}'
    st.numbered = rec[2] == '1'
    local expires = now + CLAIM_MS
    left = left + 1
    redis.call('ZREM', KEYS[4], w)
    redis.call('ZREM', KEYS[5], w)
    redis.call('HDEL', KEYS[6], id, '@' .. id)
    if redis.call('ZADD', KEYS[1], 'NX', expires, id) == 1 then
      local token, slots = hold(st, id, permits, expires, CLAIM_MS, meta)
      local later = {}
      if behind > 0 then
        for k = i + behind - spread, i + behind + spread do
          if members[k] then later[#later + 1] = member_parts(members[k]) end
        end
      end
      local grant = token .. ':' .. now .. ':' .. expires .. ':' .. slots .. ':' .. table.concat(later, ',')
      local key = push and push[id]
      if key then
        push_grant(key, grant, ttl)
      else
        if #out < first then out[first] = ttl end
        out[#out + 1] = id
        out[#out + 1] = grant
      end
    end
  end
  return left
end

-- TOTAL's direct grant: while permits are free under `total`, the partition
-- first in the ready ZSET's order whose first waiter fits under its LIMIT
-- (`limit`) is served: that waiter is granted if it fits in the free permits,
-- else it stops the grants (a large request is not starved); a partition
-- whose LIMIT is full is skipped and blocks nobody. Grants as grant_first's
-- (a claim lease, appended to `out` for the caller to push), except that of
-- `me` (an acquiring caller in the queue: {id =, lease =}), which is its own
-- lease, left in me.granted = {token, expires, slots}.
local function grant_total(now, clock, limit, total, out, me)
  local free = total - permits_held()
  local held = {}  -- partition -> permits held, as read or granted here
  local st = nil
  local first = #out + 1
  while free > 0 do
    local part, member, id, permits
    for _, entry in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
      local p = string.match(entry, '|([^|]*)$')
      local head = part_head(p)
      if head then
        local w_id, w_permits = member_parts(head)
        if not held[p] then held[p] = tonumber(redis.call('HGET', KEYS[3], 'c/' .. p) or '') or 0 end
        if held[p] + w_permits <= limit then
          if w_permits > free then return end
          part, member, id, permits = p, head, w_id, w_permits
          break
        end
      end
    end
    if not part then return end
    local rec = redis.call('HMGET', KEYS[6], id, '@' .. id)
    local meta = rec[1] and string.match(rec[1], '^%d+:%d+:(.*)$') or '{}'
    redis.call('ZREM', KEYS[4], member)
    redis.call('ZREM', KEYS[5], member)
    redis.call('HDEL', KEYS[6], id, '@' .. id)
    local mine = me and me.id == id
    local lease = mine and me.lease or CLAIM_MS
    local expires = now + lease
    local token = nil
    -- Read before the first ZADD, which creates the timeouts ZSET if the
    -- release emptied it (hold() then gives it its TTL).
    if not st then st = grant_state(now, clock) end
    if redis.call('ZADD', KEYS[1], 'NX', expires, id) == 1 then
      st.numbered = string.sub(rec[2] or '', 1, 1) == '1'
      st.part = part
      st.held = held[part]
      local slots
      token, slots = hold(st, id, permits, expires, lease, meta)
      held[part] = st.held
      free = free - permits
      if mine then
        me.granted = {token, expires, slots}
      else
        if #out < first then out[first] = math.max(10000, redis.call('PTTL', KEYS[5])) end
        out[#out + 1] = id
        out[#out + 1] = token .. ':' .. now .. ':' .. expires .. ':' .. slots
      end
    end
    ready_update(part, token)
  end
end

-- Permits came free (release, abandon): grant them to the first waiters
-- (`push`: see grant_first).
-- `known` (optional): what grant_state need not read again, `head` and
-- `leaving` (`head` only if the caller read it since its last change).
-- Returns how many wait still.
local function wake(now, clock, limit, out, push, known)
  local waiting = purge_waiters(now)
  if waiting == 0 then return 0 end
  known = known or {}
  if purge_holders(now, 100) > 0 then known = {leaving = known.leaving} end
  local st = grant_state(now, clock, known)
  local free = limit - st.holders - st.extra
  if free > 0 then waiting = waiting - grant_first(st, free, out, limit, push) end
  return waiting
end

-- Permits came free with the waiters flag set (a release): grant them to the
-- first waiters (wake; `known`: see there), and clear the flag once the queue
-- is empty.
local function serve(now, clock, limit, out, push, known)
  if wake(now, clock, limit, out, push, known) == 0 then redis.call('HDEL', KEYS[3], 'w') end
end

-- TOTAL: permits came free (release, abandon): grant them (grant_total).
local function wake_total(now, clock, limit, total, out)
  if purge_waiters(now) == 0 then return end
  purge_holders(now, 100)
  grant_total(now, clock, limit, total, out, nil)
end

-- TOTAL: permits came free with the waiters flag set (a release): grant them
-- (wake_total), and clear the flag once the queue is empty.
local function serve_total(now, clock, limit, total, out)
  wake_total(now, clock, limit, total, out)
  if redis.call('EXISTS', KEYS[4]) == 0 then redis.call('HDEL', KEYS[3], 'w') end
end

-- Record one hold time (ms) in the holds HASH, which must exist (it does while
-- it holds a record: see release.lua), so the HINCRBY keeps its TTL.
local function record_hold(ms)
  if ms < 0 then ms = 0 elseif ms > HOLD_MAX_MS then ms = HOLD_MAX_MS end
  local packed = redis.call('HINCRBY', KEYS[3], HOLDS_FIELD, string.format('%.0f', ms * HOLD_SCALE + 1))
  local n = packed % HOLD_SCALE
  if n >= HOLD_SAMPLES then
    local sum = (packed - n) / HOLD_SCALE
    redis.call('HSET', KEYS[3], HOLDS_FIELD, string.format('%.0f', math.floor(sum / 2) * HOLD_SCALE + n / 2))
  end
end

-- Milliseconds a caller with `ahead` waiters before it can expect to wait,
-- from the recent hold times: each round of `limit` holds frees `limit`
-- slots. nil when no hold has been recorded yet. `packed`: the holds HASH's
-- HOLDS_FIELD if the caller read it (false: absent), nil to read it here.
local function hold_estimate(ahead, limit, packed)
  if limit < 1 then limit = 1 end  -- paused (limit 0): as if one slot
  if packed == nil then packed = redis.call('HGET', KEYS[3], HOLDS_FIELD) end
  packed = tonumber(packed or '')
  if not packed then return nil end
  local n = packed % HOLD_SCALE
  if n == 0 then return nil end
  local mean = (packed - n) / HOLD_SCALE / n
  return math.ceil((ahead + 1) / limit) * mean
end

-- A refused caller's Retry-After estimate (ms) and when it should look again
-- at the latest (ms): the estimate comes from the recent hold times and the
-- `ahead` permits to be served before its last one (rounds of `limit`),
-- never later than the earliest lease expiry (a permit is free then at the
-- latest); a `queued` waiter also looks again when the earliest ticket
-- deadline passes (a woken waiter's claim window ending pushes no wake-up).
-- `known`: what the caller read already, each optional: `packed` (the holds
-- HASH's HOLDS_FIELD, false: absent), `expiry` (the earliest lease expiry
-- after now, false: none), `soonest` (an earliest ticket deadline: the
-- caller's own or one no later than the true earliest).
local function refusal_times(now, lease, ahead, limit, queued, known)
  known = known or {}
  local expiry = known.expiry
  if expiry == nil then
    local first = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '(+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    expiry = tonumber(first[2] or '') or false
  end
  local until_expiry = expiry and expiry - now or lease
  local estimate = hold_estimate(ahead, limit, known.packed)
  if not estimate or estimate > until_expiry then estimate = until_expiry end
  local recheck = until_expiry
  if queued then
    local soonest = known.soonest
    if not soonest then
      soonest = tonumber(redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')[2] or '')
    end
    if soonest and soonest - now < recheck then recheck = soonest - now end
  end
  return math.ceil(estimate), recheck
end

-- A retried acquire (the same identifier `id`) that already holds its permits
-- (a live lease and its record) gets them again: the acquire's grant reply
-- (see acquire.lua), or nil.
local function held_again(id, now)
  local expiry = redis.call('ZSCORE', KEYS[1], id)
  if expiry and tonumber(expiry) > now then
    local rec = redis.call('HGET', KEYS[3], id)
    if rec then
      local token, acquired = string.match(rec, '^(%d+):(%d+):')
      return {1, token, tonumber(acquired), tonumber(expiry), 0, redis.call('HGET', KEYS[3], '@' .. id) or ''}
    end
  end
end
