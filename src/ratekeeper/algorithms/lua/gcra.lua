-- gcra: the Lua twin of algorithms/gcra.py (same integer arithmetic).
--
-- KEYS[i]  rate i's key; every key of one call shares one hash tag. The state is read and
--          written only through the layout's load/save/keep (layout_keys.lua, or
--          layout_compact.lua: then the caller's hash field is the last ARGV).
-- ARGV     op ("hit" | "peek" | "refund" | "settle", or an admin's "credit" | "debit"), now_ms,
--          cost, then per rate i: count, period_ms, burst (how many may pass at one instant).
-- State    (tat_us, count): the theoretical arrival time in epoch microseconds and the rate's
--          count it was written under. T = ceil(period_ms * 1000 / count) us per unit; a tat
--          written under another count is read as the same units used (convert).
-- Value    "<count><tat_us as 16 digits>", an integer to Redis, when count < 922 and tat_us
--          is from 0 to 10**16 - 1 (until 2286); else "<tat_us>:<count>".
-- Expiry   the state means nothing once now passes tat; every save asks for a relative TTL of
--          ceil(tat_us / 1000) - now_ms + 1000. A hit rejected under another count than the
--          state's saves the state restated under its own (as gcra.step returns it), so it
--          drains at the new pace from then on.
-- Reply    hit/peek: 4 integers per rate: allowed (1/0), remaining, reset_ms, retry_ms (-1 for
--          never); refund, credit, debit, settle: an empty array. peek never writes (EVALSHA_RO).
-- Admin    credit is refund; debit moves tat cost*T on, to at most 2 capacities past empty
--          (algorithms/base.DEBT).
-- Numbers  Lua has only doubles; every value stays below 2**53, where they are exact, and
--          idiv corrects the rounding of a / b so floor division is exact too.

local op, now, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now_us = now * 1000
local DEBT = 2

-- idiv and ceil_div come from integer.lua, gcra_decode and gcra_encode from value_gcra.lua,
-- both prepended when the script is loaded.

-- a tat written under rate count `was`, read under T us per unit: the same units used (the
-- remainder's share in doubles, rounded down, as gcra.convert computes it)
local function convert(tat, was, t, period)
  local debt = tat - now_us
  if debt <= 0 or was < 1 then
    return now_us
  end
  local old = ceil_div(period * 1000, was)
  local q = idiv(debt, old)
  local r = debt - q * old
  return now_us + q * t + math.floor(r * t / old)
end

-- a theoretical arrival time not after now is the same as none at every count (the compact
-- layout sweeps such fields of other callers); it is judged as stored, under the count that
-- wrote it: converted to the caller's count, a debt of less than one of its units would look
-- idle while it still counts under its own
stale = function(i, raw)
  local tat = gcra_decode(raw)
  return not tat or tat <= now_us
end

local function ttl(tat)
  return string.format('%d', math.max(1000, ceil_div(tat, 1000) - now + 1000))
end

-- settle (a reservation's actual cost: nested.lua; gcra.settle): cost is the delta; ARGV
-- after the rates holds since_ms, debt and the charge's reset_ms (units are alike: only debt
-- is used). A refund moves tat back (never before now); an extra moves it on, up to
-- now + (burst + debt) x T.
if op == 'settle' then
  local debt = tonumber(ARGV[3 * N + 5])
  for i = 1, N do
    local count, period, burst = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]),
      tonumber(ARGV[3 * i + 3])
    local t = ceil_div(period * 1000, count)
    local stored, was = gcra_decode(load(i))
    if stored and was and was ~= count then
      stored = convert(stored, was, t, period)
    end
    local tat = now_us
    if stored and stored >= now_us then
      tat = stored
    end
    local new = nil
    if cost < 0 then
      if stored then
        new = math.max(now_us, tat + cost * t)
      end
    else
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
      save(i, gcra_encode(new, count), ttl(new))
    end
  end
  return {}
end

local reply, writes, keeps, all_allowed = {}, {}, {}, true
for i = 1, N do
  local count, period, burst = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]),
    tonumber(ARGV[3 * i + 3])
  local t = ceil_div(period * 1000, count)
  local stored, was = gcra_decode(load(i))
  if stored and was and was ~= count then
    stored = convert(stored, was, t, period)
    keeps[i] = stored
  end
  local tat = now_us
  if stored and stored >= now_us then
    tat = stored
  end
  if op == 'refund' or op == 'credit' then
    if stored then
      writes[i] = math.max(now_us, tat - cost * t)
    end
  elseif op == 'debit' then
    writes[i] = math.min(tat + cost * t, now_us + (DEBT + 1) * burst * t)
  else
    local tau = burst * t
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

if op == 'hit' and all_allowed or op == 'refund' or op == 'credit' or op == 'debit' then
  for i = 1, N do
    local tat = writes[i]
    if tat then
      save(i, gcra_encode(tat, tonumber(ARGV[3 * i + 1])), ttl(tat))
    end
  end
elseif op == 'hit' then -- rejected: a state written under another count is restated
  for i = 1, N do
    local tat = keeps[i]
    if tat and tat > now_us then
      save(i, gcra_encode(tat, tonumber(ARGV[3 * i + 1])), ttl(tat))
    end
  end
end
return reply
