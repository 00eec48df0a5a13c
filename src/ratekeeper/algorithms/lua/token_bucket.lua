-- token_bucket: the Lua twin of algorithms/token_bucket.py (same integer arithmetic).
--
-- KEYS[i]  rate i's key; every key of one call shares one hash tag. The state is read and
--          written only through the layout's load/save (layout_keys.lua, or
--          layout_compact.lua: then the caller's hash field is the last ARGV).
-- ARGV     op ("hit" | "peek" | "refund" | "settle"), now_ms, cost,
--          then per rate i: count, period_ms, burst (the bucket's capacity).
-- State    (scaled, updated_ms): tokens x period_ms, and when they were counted. scaled is
--          always a multiple of g = gcd(count, period_ms), so scaled / g is stored.
-- Value    one decimal "<scaled/g><updated_ms - 1.7e12 as 12 digits>" (an integer to Redis when
--          scaled/g < 9,223,372); "<scaled/g>:<updated_ms>" when updated_ms is before
--          2023-11-14 or after 2055 (epoch 1.7e12 + 10**12 ms).
-- Expiry   a bucket is full again at updated_ms + ceil((burst*period_ms - scaled) / count); every
--          save asks for a relative TTL of that - now_ms + 1000 (a missing key = a full bucket).
-- Reply    hit/peek: 4 integers per rate: allowed (1/0), remaining, reset_ms, retry_ms (-1 for
--          never); refund and settle: an empty array. peek never writes (EVALSHA_RO).
-- Numbers  Lua has only doubles; every value stays below 2**53, where they are exact, and
--          idiv corrects the rounding of a / b so floor division is exact too.

local op, now, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

-- idiv and ceil_div come from integer.lua, prepended when the script is loaded.

local function gcd(a, b)
  while b > 0 do
    a, b = b, a - idiv(a, b) * b
  end
  return a
end

-- times are stored as ms since EPOCH in 12 digits (until 2055), leaving 7 digits of a 64-bit
-- integer for scaled / g: 10/hour, 100/minute or 1000/hour buckets stay integers to Redis
local EPOCH = 1700000000000

local function decode(raw)
  if not raw then
    return nil, nil
  end
  local sep = string.find(raw, ':', 1, true)
  if sep then
    return tonumber(string.sub(raw, 1, sep - 1)), tonumber(string.sub(raw, sep + 1))
  end
  local n = #raw
  if n <= 12 then
    return 0, tonumber(raw) + EPOCH
  end
  return tonumber(string.sub(raw, 1, n - 12)), tonumber(string.sub(raw, n - 11)) + EPOCH
end

local function encode(high, time_ms)
  local since = time_ms - EPOCH
  if since >= 0 and since < 1e12 then
    if high == 0 then
      return string.format('%012d', since)
    end
    return string.format('%d%012d', high, since)
  end
  return string.format('%d:%d', high, time_ms)
end

-- a bucket that is full again is the same as none (the compact layout sweeps such fields)
stale = function(i, raw)
  local count, period, burst = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]),
    tonumber(ARGV[3 * i + 3])
  local high, updated = decode(raw)
  if not high then
    return true
  end
  return updated + ceil_div(burst * period - high * gcd(count, period), count) <= now
end

-- the bucket refilled to now: (scaled, updated); a clock behind the writer's changes nothing
local function level(scaled, updated, full, count)
  if not scaled then
    return full, now
  end
  if now <= updated then
    return scaled, updated
  end
  local elapsed = math.min(now - updated, ceil_div(full - scaled, count))
  return math.min(full, scaled + elapsed * count), now
end

-- settle (a reservation's actual cost: nested.lua; token_bucket.settle): cost is the delta;
-- ARGV after the rates holds since_ms, debt and the charge's reset_ms (tokens are alike: only
-- debt is used). A refund puts tokens back (never above burst); an extra takes them, down to
-- -debt.
if op == 'settle' then
  local debt = tonumber(ARGV[3 * #KEYS + 5])
  for i = 1, #KEYS do
    local count, period, burst = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]),
      tonumber(ARGV[3 * i + 3])
    local g = gcd(count, period)
    local full = burst * period
    local stored, updated = decode(load(i))
    if stored then
      stored = stored * g
    end
    local scaled, new = nil, nil
    if cost < 0 then
      if stored then
        scaled, updated = level(stored, updated, full, count)
        new = math.min(full, scaled - cost * period)
      end
    else
      scaled, updated = level(stored, updated, full, count)
      local floor = -debt * period
      new = scaled - cost * period
      if new < floor then
        new = (scaled > floor) and floor or scaled
      end
      if new == scaled then
        new = nil
      end
    end
    if new then
      local expires = updated + ceil_div(full - new, count)
      save(i, encode(idiv(new, g), updated),
        string.format('%d', math.max(1000, expires - now + 1000)))
    end
  end
  return {}
end

local reply, writes, all_allowed = {}, {}, true
for i = 1, #KEYS do
  local count, period, burst = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]),
    tonumber(ARGV[3 * i + 3])
  local g = gcd(count, period)
  local full = burst * period
  local stored, updated = decode(load(i))
  if stored then
    stored = stored * g
  end
  if op == 'refund' then
    if stored then
      local scaled
      scaled, updated = level(stored, updated, full, count)
      scaled = math.min(full, scaled + cost * period)
      writes[i] = {scaled, updated}
    end
  else
    local scaled
    scaled, updated = level(stored, updated, full, count)
    local need = cost * period
    local allowed = scaled >= need
    if allowed and op == 'hit' then
      scaled = scaled - need
      writes[i] = {scaled, updated}
    end
    local since = math.max(now, updated)
    local retry = 0
    if not allowed then
      all_allowed = false
      if cost > burst then
        retry = -1
      else
        retry = since - now + ceil_div(need - scaled, count)
      end
    end
    local n = #reply
    reply[n + 1] = allowed and 1 or 0
    reply[n + 2] = math.max(0, idiv(scaled, period)) -- a settled debt leaves scaled < 0
    reply[n + 3] = since + ceil_div(full - scaled, count)
    reply[n + 4] = retry
  end
end

if op == 'refund' or (op == 'hit' and all_allowed) then
  for i = 1, #KEYS do
    local w = writes[i]
    if w then
      local count, period, burst = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]),
        tonumber(ARGV[3 * i + 3])
      local expires = w[2] + ceil_div(burst * period - w[1], count)
      save(i, encode(idiv(w[1], gcd(count, period)), w[2]),
        string.format('%d', math.max(1000, expires - now + 1000)))
    end
  end
end
return reply
