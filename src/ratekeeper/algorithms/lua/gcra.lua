-- gcra: the Lua twin of algorithms/gcra.py (same integer arithmetic).
--
-- KEYS[i]  rate i's key; every key of one call shares one hash tag. The state is read and
--          written only through the layout's load/save (layout_keys.lua, or
--          layout_compact.lua: then the caller's hash field is the last ARGV).
-- ARGV     op ("hit" | "peek" | "refund" | "settle"), now_ms, cost,
--          then per rate i: count, period_ms, burst (how many may pass at one instant).
-- Value    tat_us, the theoretical arrival time in epoch microseconds, as a decimal integer
--          (Redis stores it as an integer). T = ceil(period_ms * 1000 / count) us per unit.
-- Expiry   the state means nothing once now passes tat; every save asks for a relative TTL of
--          ceil(tat_us / 1000) - now_ms + 1000.
-- Reply    hit/peek: 4 integers per rate: allowed (1/0), remaining, reset_ms, retry_ms (-1 for
--          never); refund and settle: an empty array. peek never writes (EVALSHA_RO).
-- Numbers  Lua has only doubles; every value stays below 2**53, where they are exact, and
--          idiv corrects the rounding of a / b so floor division is exact too.

local op, now, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now_us = now * 1000

-- idiv and ceil_div come from integer.lua, prepended when the script is loaded.

-- a theoretical arrival time not after now is the same as none (the compact layout sweeps it)
stale = function(i, raw)
  local tat = tonumber(raw)
  return not tat or tat <= now_us
end

-- settle (a reservation's actual cost: nested.lua; gcra.settle): cost is the delta; ARGV
-- after the rates holds since_ms, debt and the charge's reset_ms (units are alike: only debt
-- is used). A refund moves tat back (never before now); an extra moves it on, up to
-- now + (burst + debt) x T.
if op == 'settle' then
  local debt = tonumber(ARGV[3 * #KEYS + 5])
  for i = 1, #KEYS do
    local count, period, burst = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]),
      tonumber(ARGV[3 * i + 3])
    local t = ceil_div(period * 1000, count)
    local stored = tonumber(load(i))
    local new = nil
    if cost < 0 then
      if stored then
        new = math.max(now_us, stored + cost * t)
      end
    else
      local tat = now_us
      if stored and stored >= now_us then
        tat = stored
      end
      local cap = now_us + (burst + debt) * t
      new = tat + cost * t
      if new > cap then
        new = (tat < cap) and cap or tat
      end
      if new == tat then
        new = nil
      end
    end
    if new then
      save(i, string.format('%d', new),
        string.format('%d', math.max(1000, ceil_div(new, 1000) - now + 1000)))
    end
  end
  return {}
end

local reply, writes, all_allowed = {}, {}, true
for i = 1, #KEYS do
  local count, period, burst = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]),
    tonumber(ARGV[3 * i + 3])
  local t = ceil_div(period * 1000, count)
  local stored = tonumber(load(i))
  if op == 'refund' then
    if stored then
      writes[i] = math.max(now_us, stored - cost * t)
    end
  else
    local tau = burst * t
    local tat = now_us
    if stored and stored >= now_us then
      tat = stored
    end
    local new_tat = tat + cost * t
    local allowed = cost <= burst and new_tat - now_us <= tau
    if allowed and op == 'hit' then
      tat = new_tat
      writes[i] = tat
    end
    local retry = 0
    if not allowed then
      all_allowed = false
      if cost > burst then
        retry = -1
      else
        retry = ceil_div(new_tat - tau - now_us, 1000)
      end
    end
    local n = #reply
    reply[n + 1] = allowed and 1 or 0
    reply[n + 2] = math.max(0, idiv(now_us + tau - tat, t))
    reply[n + 3] = ceil_div(tat, 1000)
    reply[n + 4] = retry
  end
end

if op == 'refund' or (op == 'hit' and all_allowed) then
  for i = 1, #KEYS do
    local tat = writes[i]
    if tat then
      save(i, string.format('%d', tat),
        string.format('%d', math.max(1000, ceil_div(tat, 1000) - now + 1000)))
    end
  end
end
return reply
