-- fixed_window: the Lua twin of algorithms/fixed_window.py (same integer arithmetic).
--
-- KEYS[i]  rate i's key; every key of one call shares one hash tag. The state is read and
--          written only through the layout's load/save/add (layout_keys.lua, or
--          layout_compact.lua: then the caller's hash field is the last ARGV).
-- ARGV     op ("hit" | "peek" | "refund" | "settle", or an admin's "credit" | "debit"), now_ms,
--          cost, then per rate i: count, period_ms, extra: option bits, 1 aligned windows (start at
--          now - now % period), 2 count_rejected (a rejected hit is charged too; the stack's
--          rates share these two, so ARGV[6] tells for all), 4 calendar: the rate counts
--          calendar periods and period_ms is the end of the period holding now_ms, computed by
--          the caller (ratekeeper.calendar), which a window opened now stores.
-- Value    one decimal: "<count><end_ms as 13 digits>" (count left out when 0), which Redis
--          stores as an integer when it fits in 64 bits; "<count>:<end_ms>" when end_ms is
--          outside 0..10**13-1 or the count is below zero (an admin's credit: a top-up).
--          Times are epoch ms from the caller's clock (never Redis TIME).
-- Expiry   a window ends by its stored end, never by TTL; opening a window (save) asks for a
--          relative TTL of end_ms - now_ms + 1000 so idle keys vanish; later hits in it add
--          cost x 10**13 in place, which keeps both the integer encoding and that TTL; a refund
--          saves the value again.
-- Reply    hit/peek: 4 integers per rate: allowed (1/0), remaining, reset_ms, retry_ms (-1 for
--          never); refund, credit, debit, settle: an empty array. peek never writes (EVALSHA_RO).
-- Admin    credit takes cost off the count (below zero: the window holds more than its limit),
--          debit adds it whatever the limit; both open a window if none is live.

local op, now, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local flags = tonumber(ARGV[6])
local count_rejected = math.floor(flags / 2) % 2 == 1
local MAX_COUNT = 1e15 -- a count_rejected counter stops growing here (fixed_window.MAX_COUNT)

-- window_decode, window_encode and split come from value_fixed_window.lua, prepended when
-- the script is loaded.

-- Fast path, the common case: one rate, a hit in a live window whose value is the integer
-- "<count><13-digit end>" (a count below 922336). Same decision as the general code below,
-- without creating its tables and closures (Redis CPU per decision matters most here).
if op == 'hit' and N == 1 then
  local raw = load(1)
  local n = raw and #raw or 0
  local used, ends
  if n > 13 and n <= 15 then -- below 10**15 (< 2**53): split the number itself
    local v = tonumber(raw)
    if v then
      used, ends = split(v)
    end
  elseif n > 15 and n <= 19 and not string.find(raw, ':', 1, true) then
    -- beyond a double's exact range: the count and the end read apart, as window_decode does
    used, ends = tonumber(string.sub(raw, 1, n - 13)), tonumber(string.sub(raw, n - 12))
  end
  if used and ends and ends > now then
    local count = tonumber(ARGV[4])
    if used + cost > count then
      if count_rejected and used + cost < 922336 then
        add(1, cost .. '0000000000000')
      end
      if not count_rejected or used + cost < 922336 then
        return {0, math.max(0, count - used), ends, (cost <= count) and (ends - now) or -1}
      end
    end
    if used + cost < 922336 then
      add(1, cost .. '0000000000000')
      return {1, math.max(0, count - used - cost), ends, 0}
    end
  end
end
local reply, writes, all_allowed = {}, {}, true

-- a window that has ended is the same as none (the compact layout sweeps such fields)
stale = function(i, raw)
  local _, ends = window_decode(raw)
  return not ends or ends <= now
end

local function ttl(ends)
  return string.format('%d', math.max(1000, ends - now + 1000))
end

-- a hit in a live window whose value is a canonical integer adds delta x 10**13 with INCRBY:
-- the value stays an integer in place and keeps the TTL set when the window opened
local function change(i, raw, used, delta, ends)
  local n = #raw
  if delta == 0 then -- a count_rejected counter at MAX_COUNT: nothing to write
    return
  end
  if n > 13 and used >= 0 and used + delta >= 0 and used + delta < 922336
      and (n <= 15 or not string.find(raw, ':', 1, true)) then
    writes[i] = {'add', delta .. '0000000000000'}
  else
    writes[i] = {'save', window_encode(used + delta, ends), ttl(ends)}
  end
end

-- the end of a window opened now for rate i: the calendar period's (ARGV), or a period on
local function opened(i, period)
  local bits = tonumber(ARGV[3 * i + 3])
  if bits >= 4 then
    return period
  end
  return ((bits % 2 == 1) and (now - now % period) or now) + period
end

-- settle (a reservation's actual cost: nested.lua; fixed_window.settle): cost is the delta,
-- and ARGV after the rates holds since_ms (unused), debt and the end of the window the
-- reservation was counted in (its charge's reset_ms)
if op == 'settle' then
  local debt, charged = tonumber(ARGV[3 * N + 5]), tonumber(ARGV[3 * N + 6])
  for i = 1, N do
    local count, period = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
    local used, ends = window_decode(load(i))
    local live = used and ends > now
    if cost < 0 then -- back to the reservation's window while it is the live one, as refund
      if live and ends == charged and used > 0 then
        save(i, window_encode(used - math.min(-cost, used), ends), ttl(ends))
      end
    else -- an extra: into the live window, past the limit up to count + debt
      if not live then
        used, ends = 0, opened(i, period)
      end
      local add = math.min(cost, math.max(0, count + debt - used))
      if add > 0 then
        save(i, window_encode(used + add, ends), ttl(ends))
      end
    end
  end
  return {}
end

for i = 1, N do
  local count, period = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local raw = load(i)
  local used, ends = window_decode(raw)
  if op == 'refund' then
    if used and ends > now and used > 0 then -- never below zero (a credit's count stays)
      writes[i] = {'save', window_encode(used - math.min(cost, used), ends), ttl(ends)}
    end
  elseif op == 'credit' or op == 'debit' then
    if not (used and ends > now) then
      used, ends = 0, opened(i, period)
    end
    local after
    if op == 'debit' then
      after = math.min(used + cost, MAX_COUNT)
    else
      after = math.max(used - cost, -MAX_COUNT)
    end
    writes[i] = {'save', window_encode(after, ends), ttl(ends)}
  else
    local live = used and ends > now
    if not live then
      used, ends = 0, opened(i, period)
    end
    local allowed = used + cost <= count
    local left = math.max(0, count - used) -- what a rejection reports: what it found
    if op == 'hit' and (allowed or count_rejected) then
      local after = math.min(used + cost, MAX_COUNT)
      if live then
        change(i, raw, used, after - used, ends)
      else
        writes[i] = {'save', window_encode(after, ends), ttl(ends)}
      end
      used = after
    end
    local retry = 0
    if not allowed then
      all_allowed = false
      retry = (cost <= count) and (ends - now) or -1
    end
    local n = #reply
    reply[n + 1] = allowed and 1 or 0
    reply[n + 2] = allowed and math.max(0, count - used) or left
    reply[n + 3] = ends
    reply[n + 4] = retry
  end
end

if op == 'refund' or op == 'credit' or op == 'debit'
    or (op == 'hit' and (all_allowed or count_rejected)) then
  for i = 1, N do
    local w = writes[i]
    if w then
      if w[1] == 'add' then
        add(i, w[2])
      else
        save(i, w[2], w[3])
      end
    end
  end
end
return reply
