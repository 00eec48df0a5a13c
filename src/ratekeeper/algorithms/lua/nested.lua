-- nested: several caller keys decided all or nothing, and reservations settled later
-- (nested.py, reservations.py; stores/nested_codec.py builds the calls). Loaded after
-- integer.lua and a table ALG holding each algorithm's twin as a function(KEYS, ARGV, N,
-- LEGACY) over the store's key layout (stores/nested_codec.nested_script), which this script
-- calls per level with N, the number of rates it passes, and LEGACY, whether their 0.1 keys
-- follow them (stack.lua's two values, which the twin cannot derive from a settle's ARGV).
--
-- KEYS     every rate's key of every level, level by level (all carry the outermost level's
--          hash tag; a legacy level's n keys are followed by their n 0.1 names), then R and
--          Z, the reservations of that tag.
-- ARGV     op ("hit" | "peek" | "refund" | "reserve" | "settle" | "cancel"), now_ms, id,
--          amount (reserve: ttl_ms; settle: the actual cost), keep_ms (how long a settled id
--          is remembered), hold_ms (the least TTL of R and Z), the number of levels, then per
--          level: the algorithm's name, its number of rates n, cost, settles (1: its cost is
--          the call's, settled later), field (the compact layout's hash field, or ''), legacy
--          (1: its keys' 0.1 names follow them), then per rate: count, period_ms (a calendar
--          rate's: the end of its period holding now_ms), extra, debt (the units a settle may
--          charge past the limit).
-- R, Z     R maps a reservation id to its record (JSON: t = since_ms, e = the estimate, l = the
--          settling levels as parsed below, each with marks: the reset_ms each rate's charge
--          answered, which names the window or bucket it went into whatever other callers'
--          clocks did since) or to '-' once settled or cancelled; Z scores each
--          id by when it expires (live) or is forgotten (settled). Every call first sweeps up
--          to 32 ids due by now: a live one gives its estimate back where it was charged.
-- Reply    hit/peek/reserve: allowed (1/0), then 4 integers per rate of every level: the
--          outcomes of the charge when every level admits, else of a look that charged
--          nothing (a level of cost 0 is only looked at); reserve with an id in use: {-1}.
--          refund (each level's cost given back, as the algorithm's refund): {1}.
--          settle/cancel: {status}: 1 settled, 2 already settled or cancelled (nothing
--          charged), 3 unknown or expired (settle: the actual cost charged now; cancel: nothing).
-- Times    now_ms from the caller's clock; R and Z get a relative TTL that outlives every score
--          and hold_ms, so an expired estimate always finds the state it goes back to.

local op, now_ms = ARGV[1], ARGV[2]
local now = tonumber(now_ms)
local id, amount = ARGV[3], tonumber(ARGV[4])
local keep, hold = tonumber(ARGV[5]), tonumber(ARGV[6])
local RKEY, ZKEY = KEYS[#KEYS - 1], KEYS[#KEYS]
local SWEEP = 32

local levels = {}
local a, k = 8, 1
for i = 1, tonumber(ARGV[7]) do
  local lv = {name = ARGV[a], cost = ARGV[a + 2], settles = ARGV[a + 3], field = ARGV[a + 4],
    keys = {}, rates = {}}
  local n = tonumber(ARGV[a + 1])
  local legacy = ARGV[a + 5] == '1'
  a = a + 6
  for j = 1, n do
    lv.keys[j] = KEYS[k]
    lv.rates[j] = {ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]}
    k, a = k + 1, a + 4
  end
  if legacy then
    lv.old = {}
    for j = 1, n do
      lv.old[j] = KEYS[k]
      k = k + 1
    end
  end
  levels[i] = lv
end

-- one algorithm call on rates first..last of a level: what, cost, and for a settle since_ms,
-- debt and the charge's reset_ms after the rates; the layout's field last
local function run(lv, first, last, what, cost, since, debt, mark)
  local keys, argv = {}, {what, now_ms, cost}
  for j = first, last do
    keys[#keys + 1] = lv.keys[j]
    local r = lv.rates[j]
    argv[#argv + 1], argv[#argv + 2], argv[#argv + 3] = r[1], r[2], r[3]
  end
  if lv.old then
    for j = first, last do
      keys[#keys + 1] = lv.old[j]
    end
  end
  if since then
    argv[#argv + 1], argv[#argv + 2], argv[#argv + 3] = since, debt, mark
  end
  if lv.field ~= '' then
    argv[#argv + 1] = lv.field
  end
  return ALG[lv.name](keys, argv, last - first + 1, lv.old ~= nil)
end

-- delta more (or -delta fewer) units than charged at since: each rate with its own debt and
-- mark (none for a settle of an unknown reservation: only an extra, which needs none)
local function settle(lv, delta, since)
  if delta ~= 0 then
    local d = string.format('%d', delta)
    for j = 1, #lv.keys do
      run(lv, j, j, 'settle', d, since, lv.rates[j][4], lv.marks and lv.marks[j] or '0')
    end
  end
end

-- R and Z live past their latest score and at least hold_ms (relative: our clock may differ)
local function touch()
  local top = redis.call('ZRANGE', ZKEY, -1, -1, 'WITHSCORES')
  local ttl = hold
  if top[2] then
    ttl = math.max(ttl, tonumber(top[2]) - now + 1000)
  end
  for _, key in ipairs({RKEY, ZKEY}) do
    if redis.call('PTTL', key) < ttl then
      redis.call('PEXPIRE', key, string.format('%d', ttl))
    end
  end
end

local due = redis.call('ZRANGEBYSCORE', ZKEY, '-inf', now, 'LIMIT', 0, SWEEP)
for _, rid in ipairs(due) do
  local raw = redis.call('HGET', RKEY, rid)
  if raw and raw ~= '-' then -- expired: its estimate goes back
    local rec = cjson.decode(raw)
    for _, lv in ipairs(rec.l) do
      settle(lv, -tonumber(rec.e), rec.t)
    end
  end
  redis.call('HDEL', RKEY, rid)
end
if #due > 0 then
  redis.call('ZREM', ZKEY, unpack(due))
end

if op == 'hit' or op == 'peek' or op == 'reserve' then
  if op == 'reserve' and redis.call('HEXISTS', RKEY, id) == 1 then
    return {-1}
  end
  local outs, ok = {}, true
  for i, lv in ipairs(levels) do
    outs[i] = run(lv, 1, #lv.keys, 'peek', lv.cost)
    for j = 1, #outs[i], 4 do
      if outs[i][j] == 0 then
        ok = false
      end
    end
  end
  if ok and op ~= 'peek' then
    local rec = {t = now_ms, e = '0', l = {}}
    for i, lv in ipairs(levels) do
      if lv.cost ~= '0' then
        outs[i] = run(lv, 1, #lv.keys, 'hit', lv.cost)
      end
      if lv.settles == '1' then
        lv.marks = {}
        for j = 1, #lv.keys do
          lv.marks[j] = string.format('%d', outs[i][4 * j - 1])
        end
        rec.e = lv.cost
        rec.l[#rec.l + 1] = lv
      end
    end
    if op == 'reserve' then
      redis.call('HSET', RKEY, id, cjson.encode(rec))
      redis.call('ZADD', ZKEY, now + amount, id)
      touch()
    end
  end
  local reply = {ok and 1 or 0}
  for i = 1, #outs do
    for j = 1, #outs[i] do
      reply[#reply + 1] = outs[i][j]
    end
  end
  return reply
end

if op == 'refund' then
  for _, lv in ipairs(levels) do
    if lv.cost ~= '0' then
      run(lv, 1, #lv.keys, 'refund', lv.cost)
    end
  end
  return {1}
end

-- settle or cancel
local raw = redis.call('HGET', RKEY, id)
if raw == '-' then
  return {2}
end
local status = 3
local actual = (op == 'settle') and amount or 0
if raw then
  local rec = cjson.decode(raw)
  -- a calendar rate's window end is the one holding now (the record has the reserve's): from
  -- this call's levels, the reservation's own, whose settling levels are the record's
  local current = {}
  for _, lv in ipairs(levels) do
    if lv.settles == '1' then
      current[#current + 1] = lv
    end
  end
  for i, lv in ipairs(rec.l) do
    local now_lv = current[i]
    if now_lv and now_lv.name == lv.name and #now_lv.rates == #lv.rates then
      for j, r in ipairs(lv.rates) do
        r[2] = now_lv.rates[j][2]
      end
    end
    settle(lv, actual - tonumber(rec.e), rec.t)
  end
  status = 1
elseif op == 'settle' then -- expired (its estimate came back) or never issued: the actual now
  for _, lv in ipairs(levels) do
    if lv.settles == '1' then
      settle(lv, actual, now_ms)
    end
  end
end
redis.call('HSET', RKEY, id, '-')
redis.call('ZADD', ZKEY, now + keep, id)
touch()
return {status}
