-- slices: the Lua twin of algorithms/slices.py (same integer arithmetic): settle a process's
-- earlier slices, charge its debt and grant it a new slice of a key's budget, in one step.
--
-- KEYS[1]  the algorithm's own state key (the same key its script reads and writes)
-- KEYS[2]  the key's reservation: "<expires_ms>:<slice id>:<units>:..." by expiry, one triple
--          per live slice (token_bucket and gcra cap their refill by the units held; a settle
--          finds its slice here). Both keys share the caller key's hash tag.
-- ARGV     algorithm ("fixed_window" | "token_bucket" | "gcra"), now_ms, count, period_ms,
--          extra (fixed_window: option bits, 1 aligned; token_bucket, gcra: burst), need, want,
--          share (0: a peek, grants nothing), debt, settles ("<slice id>:<units spent>,..."
--          or ""), slice_id (of the new slice; hex), epoch_ms (see slices.Ask), reset ("1":
--          forget the settled slices and start the key over but for the units held in the
--          other live slices, slices.restart; the reply is then a peek's; else "0").
-- Values   the algorithms' own encodings: fixed_window "<count><end_ms, 13 digits>" (or
--          "<count>:<end_ms>", and so when the count is below zero); token_bucket
--          "<debt><updated_ms - 1.7e12, 12 digits>" (or "<debt>:<updated_ms>"); gcra
--          "<count><tat_us, 16 digits>" (or "<tat_us>:<count>"; a tat of another count is
--          converted as gcra.lua does). A debt past a lowered capacity leaves nothing available.
-- Expiry   both keys get a relative TTL of expires - now_ms + 1000 (at least 1000), where
--          expires is slices.expires_ms: the algorithm's, or later while a reservation still
--          shapes the bucket. An empty reservation is deleted. Nothing is written when the
--          call changes nothing.
-- Reply    8 integers: granted, remaining, reset_ms, retry_ms (0 when need fits, -1 for
--          never), expires_ms, held, returned, charged (slices.Taken).

local name, now = ARGV[1], tonumber(ARGV[2])
local count, period, extra = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local need, want, share = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local debt, settles, slice_id = tonumber(ARGV[9]), ARGV[10], ARGV[11]
local epoch = tonumber(ARGV[12])
local reset = ARGV[13] == '1'

-- idiv and ceil_div come from integer.lua, the algorithms' value encodings (window_, bucket_
-- and gcra_decode/encode) from value_<algorithm>.lua, all prepended when the script is loaded.

local function load_pairs()
  local ps = {}
  local raw = redis.call('GET', KEYS[2])
  if raw then
    local parts = {}
    for field in string.gmatch(raw, '[^:]+') do
      parts[#parts + 1] = field
    end
    for i = 1, #parts - 2, 3 do
      ps[#ps + 1] = {tonumber(parts[i]), parts[i + 1], tonumber(parts[i + 2])}
    end
  end
  return ps
end

local function live(ps)
  local out = {}
  for _, p in ipairs(ps) do
    if p[1] > now then
      out[#out + 1] = p
    end
  end
  return out
end

local function total(ps)
  local n = 0
  for _, p in ipairs(ps) do
    n = n + p[3]
  end
  return n
end

-- forget the settled slices; the units granted and not spent (what goes back)
local function settle(ps)
  if settles == '' then
    return ps, 0
  end
  local spent = {}
  for id, units in string.gmatch(settles, '([^:,]+):([^,]+)') do
    spent[id] = tonumber(units)
  end
  local kept, back = {}, 0
  for _, p in ipairs(ps) do
    local used = spent[p[2]]
    if used then
      back = back + math.max(0, p[3] - used)
    else
      kept[#kept + 1] = p
    end
  end
  return kept, back
end

local function add(ps, e, units)
  if units <= 0 then
    return ps
  end
  ps[#ps + 1] = {e, slice_id, units}
  table.sort(ps, function(a, b)
    if a[1] ~= b[1] then
      return a[1] < b[1]
    end
    return a[2] < b[2]
  end)
  return ps
end

local function grant(available)
  if need <= 0 or need > available or share <= 0 then
    return 0
  end
  local most = math.max(need, idiv(available, share))
  return math.min(want, most)
end

local function fmt(x)
  return string.format('%d', x)
end

local ps = load_pairs()
if reset then -- start over but for the slices still held by others (slices.restart)
  ps = settle(live(ps))
  local held = total(ps)
  if held == 0 then
    redis.call('DEL', KEYS[1], KEYS[2])
  else
    local last, value, keep = ps[#ps][1], nil, nil -- ps is by expiry
    if name == 'fixed_window' then
      value, keep = window_encode(held, last), last
    elseif name == 'token_bucket' then
      held = math.min(held, extra)
      value = bucket_encode(held * period, now)
      keep = math.max(now + ceil_div(held * period, count), last + ceil_div(extra * period, count))
    elseif name == 'gcra' then
      held = math.min(held, extra)
      local t = ceil_div(period * 1000, count)
      local tat = now * 1000 + held * t
      value = gcra_encode(tat, count)
      keep = math.max(ceil_div(tat, 1000), last + ceil_div(extra * t, 1000))
    else
      return redis.error_reply('slices.lua: algorithm ' .. tostring(name) .. ' cannot be sliced')
    end
    local ttl = string.format('%d', math.max(1000, keep - now + 1000))
    local parts = {}
    for _, p in ipairs(ps) do
      parts[#parts + 1] = string.format('%d', p[1]) .. ':' .. p[2] .. ':' .. string.format('%d', p[3])
    end
    redis.call('SET', KEYS[1], value, 'PX', ttl)
    redis.call('SET', KEYS[2], table.concat(parts, ':'), 'PX', ttl)
  end
  settles, need, want, share, debt = '', 0, 0, 0, 0 -- the rest answers as a peek
end
local granted, remaining, reset_ms, retry, expires = 0, 0, 0, 0, 0
local returned, charged, changed = 0, 0, false
local value, keep -- the new state's encoding, and when it and the reservation stop mattering

if name == 'fixed_window' then
  local used, ends = window_decode(redis.call('GET', KEYS[1]))
  ps = live(ps)
  if not used or ends <= now then
    if #ps > 0 then -- the state is gone but slices of its window are held: they stay counted
      used, ends = total(ps), ps[#ps][1]
    else
      used = 0
      ends = ((extra % 2 == 1) and (now - now % period) or now) + period
    end
  end
  local back
  ps, back = settle(ps)
  returned = math.min(back, used)
  used = used - returned
  local available = math.max(0, count - used)
  charged = math.min(debt, available)
  used = used + charged
  granted = grant(available - charged)
  used = used + granted
  ps = add(ps, ends, granted)
  changed = settles ~= '' or charged > 0 or granted > 0
  if need > available - charged then
    retry = (need <= count) and (ends - now) or -1
  end
  remaining = math.max(0, count - used)
  reset_ms, expires, keep = ends, ends, ends
  value = window_encode(used, ends)
elseif name == 'token_bucket' then
  local burst = extra
  local full = burst * period
  local owed, updated = bucket_decode(redis.call('GET', KEYS[1]))
  local scaled = full
  if owed then
    scaled = full - owed
  else
    updated = now
  end
  local held = total(ps)
  if now > updated then -- refill phase by phase: each lapsed reservation lifts the cap
    local t = updated
    for _, p in ipairs(ps) do
      if p[1] >= now then
        break
      end
      if p[1] > t then
        scaled = math.min((burst - held) * period, scaled + (p[1] - t) * count)
        t = p[1]
      end
      held = held - p[3]
    end
    scaled = math.min((burst - held) * period, scaled + (now - t) * count)
    updated = now
  else -- a clock behind the last writer refills nothing
    scaled = math.min(scaled, (burst - total(live(ps))) * period)
  end
  local back
  ps, back = settle(live(ps))
  if back > 0 then
    local new = math.min((burst - total(ps)) * period, scaled + back * period)
    if new > scaled then
      returned = idiv(new - scaled, period)
      scaled = new
    end
  end
  local available = math.max(0, idiv(scaled, period)) -- a lowered capacity: the debt drains
  charged = math.min(debt, available)
  scaled = scaled - charged * period
  local short = need > available - charged
  granted = grant(available - charged)
  scaled = scaled - granted * period
  expires = (idiv(now, epoch) + 2) * epoch
  ps = add(ps, expires, granted)
  changed = settles ~= '' or charged > 0 or granted > 0
  local since = math.max(updated, now)
  reset_ms = since + ceil_div(full - scaled, count)
  if short then
    retry = (need > burst) and -1 or (since - now + ceil_div(need * period - scaled, count))
  end
  remaining = math.max(0, idiv(scaled, period))
  keep = updated + ceil_div(full - scaled, count)
  if #ps > 0 then
    keep = math.max(keep, ps[#ps][1] + ceil_div(full, count)) -- ps is by expiry
  end
  value = bucket_encode(full - scaled, updated)
elseif name == 'gcra' then
  local burst = extra
  local t = ceil_div(period * 1000, count)
  local tau = burst * t
  local now_us = now * 1000
  local tat, was = gcra_decode(redis.call('GET', KEYS[1]))
  if tat and was and was ~= count then -- written under another count: the same units used
    local debt_us = tat - now_us
    if debt_us <= 0 or was < 1 then
      tat = now_us
    else
      local old = ceil_div(period * 1000, was)
      local q = idiv(debt_us, old)
      tat = now_us + q * t + math.floor((debt_us - q * old) * t / old)
    end
  end
  if not tat or tat < now_us then
    tat = now_us
  end
  local held = total(ps)
  for _, p in ipairs(ps) do -- while units are reserved the arrival time stays >= time + held x T
    tat = math.max(tat, math.min(p[1], now) * 1000 + held * t)
    if p[1] > now then
      break
    end
    held = held - p[3]
  end
  local back
  ps, back = settle(live(ps))
  if back > 0 then
    local new = math.max(tat - back * t, now_us + total(ps) * t)
    if new < tat then
      returned = idiv(tat - new, t)
      tat = new
    end
  end
  local available = math.max(0, idiv(now_us + tau - tat, t))
  charged = math.min(debt, available)
  tat = tat + charged * t
  local short = need > available - charged
  granted = grant(available - charged)
  tat = tat + granted * t
  expires = (idiv(now, epoch) + 2) * epoch
  ps = add(ps, expires, granted)
  changed = settles ~= '' or charged > 0 or granted > 0
  if short then
    retry = (need > burst) and -1 or ceil_div(tat + need * t - tau - now_us, 1000)
  end
  remaining = math.max(0, idiv(now_us + tau - tat, t))
  reset_ms = ceil_div(tat, 1000)
  keep = reset_ms
  if #ps > 0 then
    keep = math.max(keep, ps[#ps][1] + ceil_div(tau, 1000))
  end
  value = gcra_encode(tat, count)
else
  return redis.error_reply('slices.lua: algorithm ' .. tostring(name) .. ' cannot be sliced')
end

if changed then
  local ttl = fmt(math.max(1000, keep - now + 1000))
  redis.call('SET', KEYS[1], value, 'PX', ttl)
  if #ps > 0 then
    local parts = {}
    for _, p in ipairs(ps) do
      parts[#parts + 1] = fmt(p[1]) .. ':' .. p[2] .. ':' .. fmt(p[3])
    end
    redis.call('SET', KEYS[2], table.concat(parts, ':'), 'PX', ttl)
  else
    redis.call('DEL', KEYS[2])
  end
end
local held = total(ps)
return {granted, remaining, reset_ms, retry, expires, held, returned, charged}
