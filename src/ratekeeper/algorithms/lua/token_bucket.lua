-- token_bucket: the Lua twin of algorithms/token_bucket.py (same integer arithmetic).
--
-- KEYS[i]  rate i's key; every key of one call shares one hash tag. The state is read and
--          written only through the layout's load/save/keep (layout_keys.lua, or
--          layout_compact.lua: then the caller's hash field is the last ARGV).
-- ARGV     op ("hit" | "peek" | "refund" | "settle", or an admin's "credit" | "debit"), now_ms,
--          cost, then per rate i: count, period_ms, burst (the bucket's capacity).
-- State    (debt, updated_ms): the missing tokens x period_ms, and when they were counted. It
--          holds no count: a rate raised or lowered reads the same debt (a missing key is a
--          full bucket).
-- Value    one decimal "<debt><updated_ms - 1.7e12 as 12 digits>" (an integer to Redis when
--          debt < 9,223,372); "<debt>:<updated_ms>" when updated_ms is before 2023-11-14 or
--          after 2055 (epoch 1.7e12 + 10**12 ms).
-- Expiry   a bucket is full again at updated_ms + ceil(debt / count); every save asks for a
--          relative TTL of that - now_ms + 1000, and a rejection keeps the state at least
--          that long (a lowered count drains the debt more slowly than it was written for).
-- Reply    hit/peek: 4 integers per rate: allowed (1/0), remaining, reset_ms, retry_ms (-1 for
--          never); refund, credit, debit, settle: an empty array. peek never writes (EVALSHA_RO).
-- Admin    credit is refund; debit takes cost tokens whatever the bucket holds, down to
--          2 capacities past empty (algorithms/base.DEBT).
-- Numbers  Lua has only doubles; every value stays below 2**53, where they are exact, and
--          idiv corrects the rounding of a / b so floor division is exact too.

local op, now, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local DEBT = 2

-- idiv and ceil_div come from integer.lua, bucket_decode and bucket_encode from
-- value_token_bucket.lua, both prepended when the script is loaded.

-- a 0.1 value (layout LEGACY): "<tokens x period / gcd(count, period)><since>", the tokens the
-- bucket held; the debt is what a bucket of this burst lacks
adopt = function(i, raw)
  local count, period, burst = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]),
    tonumber(ARGV[3 * i + 3])
  local a, b = count, period
  while b > 0 do
    a, b = b, a - idiv(a, b) * b
  end
  local high, updated = bucket_decode(raw)
  return bucket_encode(math.max(0, burst * period - high * a), updated)
end

-- a bucket full again at every count is the same as none (the compact layout sweeps such
-- fields of other callers): a hash holds buckets of one period written at any count, and the
-- debt drains at the reader's count, so it is judged at the slowest, 1 per period, never at
-- the caller's (a bucket that a faster count would call full still counts under its own)
stale = function(i, raw)
  local debt, updated = bucket_decode(raw)
  if not debt then
    return true
  end
  return updated + debt <= now
end

-- the debt refilled to now: (debt, updated); a clock behind the writer's changes nothing
local function level(debt, updated, count)
  if not debt then
    return 0, now
  end
  if now <= updated then
    return debt, updated
  end
  return math.max(0, debt - (now - updated) * count), now
end

local function ttl(debt, updated, count)
  return string.format('%d', math.max(1000, updated + ceil_div(debt, count) - now + 1000))
end

-- settle (a reservation's actual cost: nested.lua; token_bucket.settle): cost is the delta;
-- ARGV after the rates holds since_ms, debt and the charge's reset_ms (tokens are alike: only
-- debt is used). A refund puts tokens back (never above burst); an extra takes them, down to
-- debt tokens past empty.
if op == 'settle' then
  local debt = tonumber(ARGV[3 * N + 5])
  for i = 1, N do
    local count, period, burst = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]),
      tonumber(ARGV[3 * i + 3])
    local stored, updated = bucket_decode(load(i))
    local missing, new = nil, nil
    if cost < 0 then
      if stored then
        missing, updated = level(stored, updated, count)
        new = math.max(0, missing + cost * period)
      end
    else
      missing, updated = level(stored, updated, count)
      local most = (burst + debt) * period
      new = missing + cost * period
      if new > most then
        new = (missing < most) and most or missing
      end
      if new == missing then
        new = nil
      end
    end
    if new then
      save(i, bucket_encode(new, updated), ttl(new, updated, count))
    end
  end
  return {}
end

local reply, writes, held, all_allowed = {}, {}, {}, true
for i = 1, N do
  local count, period, burst = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]),
    tonumber(ARGV[3 * i + 3])
  local full = burst * period
  local stored, updated = bucket_decode(load(i))
  held[i] = {stored, updated}
  if op == 'refund' or op == 'credit' then
    if stored then
      local debt
      debt, updated = level(stored, updated, count)
      writes[i] = {math.max(0, debt - cost * period), updated}
    end
  elseif op == 'debit' then
    local debt
    debt, updated = level(stored, updated, count)
    writes[i] = {math.min(debt + cost * period, (DEBT + 1) * full), updated}
  else
    local debt
    debt, updated = level(stored, updated, count)
    local need = cost * period
    local allowed = debt + need <= full
    if allowed and op == 'hit' then
      debt = debt + need
      writes[i] = {debt, updated}
    end
    local since = math.max(now, updated)
    local retry = 0
    if not allowed then
      all_allowed = false
      if cost > burst then
        retry = -1
      else
        retry = since - now + ceil_div(debt + need - full, count)
      end
    end
    local n = #reply
    reply[n + 1] = allowed and 1 or 0
    reply[n + 2] = math.max(0, idiv(full - debt, period))
    reply[n + 3] = since + ceil_div(debt, count)
    reply[n + 4] = retry
  end
end

if op == 'hit' and all_allowed or op == 'refund' or op == 'credit' or op == 'debit' then
  for i = 1, N do
    local w = writes[i]
    if w then
      local count = tonumber(ARGV[3 * i + 1])
      save(i, bucket_encode(w[1], w[2]), ttl(w[1], w[2], count))
    end
  end
elseif op == 'hit' then -- rejected: a lowered count may need the state longer than written
  for i = 1, N do
    local debt, updated = held[i][1], held[i][2]
    if debt and debt > 0 then
      keep(i, ttl(debt, updated, tonumber(ARGV[3 * i + 1])))
    end
  end
end
return reply
