-- sliding_window: the Lua twin of algorithms/sliding_window.py (same integer arithmetic).
--
-- KEYS[i]  rate i's key; every key of one call shares one hash tag. The state is read and
--          written only through the layout's load/save (layout_keys.lua, or
--          layout_compact.lua: then the caller's hash field is the last ARGV).
-- ARGV     op ("hit" | "peek" | "refund" | "settle", or an admin's "credit" | "debit"), now_ms,
--          cost, then per rate i: count, period_ms, buckets (sub-intervals per period).
-- State    (index of the newest bucket, counts newest first), index = floor(t * buckets /
--          period_ms) on the epoch-aligned grid; trailing zero counts are left out.
-- Value    "<index>:<count0>:<count1>..." in decimal, e.g. "28333334:7:12".
-- Expiry   the newest bucket leaves the estimate at ceil((index + buckets + 1) * period_ms /
--          buckets); every save asks for a relative TTL of that - now_ms + 1000.
-- Reply    hit/peek: 4 integers per rate: allowed (1/0), remaining, reset_ms, retry_ms (-1 for
--          never); refund, credit, debit, settle: an empty array. peek never writes (EVALSHA_RO).
-- Admin    credit is refund; debit adds cost to the newest bucket whatever the estimate, up to
--          3 times the count in all buckets (algorithms/base.DEBT).
-- Numbers  Lua has only doubles; every value stays below 2**53, where they are exact, and
--          idiv corrects the rounding of a / b so floor division is exact too.
-- counts[j + 1] here is counts[j] in the Python twin.

local op, now, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

-- idiv and ceil_div come from integer.lua, prepended when the script is loaded.

-- shift the stored counts to the bucket holding now: cur, elapsed part x period, counts
local function align(raw, n, p)
  local cur = idiv(now * n, p)
  local counts = {}
  for j = 1, n + 1 do
    counts[j] = 0
  end
  local elapsed = now * n - cur * p
  if raw then
    local idx, shift, j = nil, 0, 0
    for field in string.gmatch(raw, '[^:]+') do
      if not idx then
        idx = tonumber(field)
        if cur < idx then
          cur, elapsed = idx, 0
        else
          shift = cur - idx
        end
      else
        if j + shift <= n then
          counts[j + shift + 1] = tonumber(field)
        end
        j = j + 1
      end
    end
  end
  return cur, elapsed, counts
end

-- counts whose newest bucket has left the estimate are the same as none (the compact layout
-- sweeps such fields)
stale = function(i, raw)
  local p, n = tonumber(ARGV[3 * i + 2]), tonumber(ARGV[3 * i + 3])
  local idx = tonumber(string.match(raw, '^[^:]+'))
  return not idx or ceil_div((idx + n + 1) * p, n) <= now
end

local function encode(cur, counts)
  local last = #counts
  while last > 1 and counts[last] == 0 do
    last = last - 1
  end
  local parts = {string.format('%d', cur)}
  for j = 1, last do
    parts[j + 1] = string.format('%d', counts[j])
  end
  return table.concat(parts, ':')
end

local function sum(counts, first, last)
  local s = 0
  for j = first, last do
    s = s + counts[j]
  end
  return s
end

local function reset_ms(counts, cur, n, p)
  for j = 1, n + 1 do
    if counts[j] ~= 0 then
      return math.max(now, ceil_div((cur - (j - 1) + n + 1) * p, n))
    end
  end
  return now
end

-- the first whole ms at which cost more would fit, if nothing else arrives
local function admit_at(counts, cur, n, p, count)
  for k = 0, n do
    local full = sum(counts, 1, n - k)
    local oldest = counts[n - k + 1]
    local room = (count - full - cost) * p
    if room >= 0 then
      local need = 0
      if oldest ~= 0 then
        need = p - idiv(room, oldest)
      end
      return math.max(now, ceil_div((cur + k) * p + math.max(0, need), n))
    end
  end
  return now
end

-- settle (a reservation's actual cost: nested.lua; sliding_window.settle): cost is the
-- delta; ARGV after the rates holds since_ms (unused), debt and the reset_ms the
-- reservation's charge answered, which names the bucket it was counted in. A refund comes out
-- of that bucket while it is in the estimate; an extra goes into the newest bucket, while the
-- estimate stays within count + debt.
if op == 'settle' then
  local debt, charged = tonumber(ARGV[3 * N + 5]), tonumber(ARGV[3 * N + 6])
  for i = 1, N do
    local count, p, n = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]),
      tonumber(ARGV[3 * i + 3])
    local raw = load(i)
    local changed = false
    local cur, elapsed, counts = align(raw, n, p)
    if cost < 0 then
      for j = 0, n do -- the bucket whose reset is charged, newest first
        if raw and ceil_div((cur - j + n + 1) * p, n) == charged and counts[j + 1] > 0 then
          counts[j + 1] = counts[j + 1] - math.min(-cost, counts[j + 1])
          changed = true
          break
        end
      end
    elseif cost > 0 then
      local used = sum(counts, 1, n) * p + counts[n + 1] * (p - elapsed)
      local add = math.min(cost, math.max(0, idiv((count + debt) * p - used, p)))
      if add > 0 then
        counts[1] = counts[1] + add
        changed = true
      end
    end
    if changed then
      local expires = ceil_div((cur + n + 1) * p, n)
      save(i, encode(cur, counts), string.format('%d', math.max(1000, expires - now + 1000)))
    end
  end
  return {}
end

local reply, writes, all_allowed = {}, {}, true
for i = 1, N do
  local count, p, n = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]),
    tonumber(ARGV[3 * i + 3])
  local raw = load(i)
  if op == 'debit' then
    local cur, _, counts = align(raw, n, p)
    local room = 3 * count - sum(counts, 1, n + 1)
    counts[1] = counts[1] + math.max(0, math.min(cost, room))
    writes[i] = {cur, counts}
  elseif op == 'refund' or op == 'credit' then
    if raw then
      local cur, _, counts = align(raw, n, p)
      local left = cost
      for j = 1, n + 1 do
        local give = math.min(left, counts[j])
        counts[j] = counts[j] - give
        left = left - give
        if left == 0 then
          break
        end
      end
      writes[i] = {cur, counts}
    end
  else
    local cur, elapsed, counts = align(raw, n, p)
    local used = sum(counts, 1, n) * p + counts[n + 1] * (p - elapsed)
    local allowed = used + cost * p <= count * p
    if allowed and op == 'hit' then
      counts[1] = counts[1] + cost
      used = used + cost * p
      writes[i] = {cur, counts}
    end
    local retry = 0
    if not allowed then
      all_allowed = false
      if cost > count then
        retry = -1
      else
        retry = admit_at(counts, cur, n, p, count) - now
      end
    end
    local m = #reply
    reply[m + 1] = allowed and 1 or 0
    reply[m + 2] = math.max(0, idiv(count * p - used, p))
    reply[m + 3] = reset_ms(counts, cur, n, p)
    reply[m + 4] = retry
  end
end

if op == 'refund' or op == 'credit' or op == 'debit' or (op == 'hit' and all_allowed) then
  for i = 1, N do
    local w = writes[i]
    if w then
      local p, n = tonumber(ARGV[3 * i + 2]), tonumber(ARGV[3 * i + 3])
      local expires = ceil_div((w[1] + n + 1) * p, n)
      save(i, encode(w[1], w[2]), string.format('%d', math.max(1000, expires - now + 1000)))
    end
  end
end
return reply
