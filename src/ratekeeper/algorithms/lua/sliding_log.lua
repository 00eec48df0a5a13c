-- sliding_log: the Lua twin of algorithms/sliding_log.py (the exact sliding window).
--
-- KEYS[i]  rate i's key; every key of one call shares the caller's hash tag (with LEGACY,
--          KEYS[N + i] its 0.1 name: a list found only there is copied over, stack.lua).
-- ARGV     op ("hit" | "peek" | "refund" | "settle", or an admin's "credit" | "debit"), now_ms,
--          cost, then per rate i: count, period_ms, extra (unused: 0).
-- Value    a Redis list of admission times in epoch ms, oldest first, one element per admitted
--          unit (cost n = n equal elements); Redis packs them as integers (~10 bytes each).
--          An element ts counts while now_ms < ts + period_ms; older ones are trimmed from the
--          head by hit and refund (never by peek).
-- Expiry   the newest element leaves the window at last + period_ms; every write sets a
--          relative PEXPIRE of that - now_ms + 1000.
-- Reply    hit/peek: 4 integers per rate: allowed (1/0), remaining, reset_ms, retry_ms (-1 for
--          never); refund, credit, debit, settle: an empty array. peek never writes (EVALSHA_RO).
-- Admin    credit is refund; debit logs cost units at now whatever the window holds, up to 3
--          times the count (algorithms/base.DEBT).
-- Cost     O(log n) LINDEX probes to find the expired head, O(cost) to append.

local op, now, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local function at(key, index)
  return tonumber(redis.call('LINDEX', key, index))
end

-- how many elements at the head are <= cutoff (the list is sorted)
local function expired(key, len, cutoff)
  if len == 0 or at(key, 0) > cutoff then
    return 0
  end
  if at(key, -1) <= cutoff then
    return len
  end
  local lo, hi = 1, len - 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if at(key, mid) > cutoff then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end

-- insert n copies of now after every element <= now (Python's insort)
local function add(key, n)
  local last = at(key, -1)
  if not last or last <= now then
    local chunk = {}
    for j = 1, math.min(n, 1000) do
      chunk[j] = ARGV[2]
    end
    while n > 0 do
      local m = math.min(n, 1000)
      redis.call('RPUSH', key, unpack(chunk, 1, m))
      n = n - m
    end
    return
  end
  -- a writer with a clock ahead of ours: insert before the first element > now
  local k = -1
  while true do
    local v = at(key, k - 1)
    if not v or v <= now then
      break
    end
    k = k - 1
  end
  local pivot = redis.call('LINDEX', key, k)
  for _ = 1, n do
    redis.call('LINSERT', key, 'BEFORE', pivot, ARGV[2])
  end
end

local function expire(key, period)
  local last = at(key, -1)
  if last then
    redis.call('PEXPIRE', key, string.format('%d', math.max(1000, last + period - now + 1000)))
  end
end

-- rate i's list: with LEGACY, a list found only under its 0.1 name is read there (a peek) or
-- carried over (COPY keeps its TTL; the old key stays until its TTL)
local function list(i)
  local key = KEYS[i]
  if LEGACY and redis.call('EXISTS', key) == 0 and redis.call('EXISTS', KEYS[N + i]) == 1 then
    if op == 'peek' then
      return KEYS[N + i]
    end
    redis.call('COPY', KEYS[N + i], key)
  end
  return key
end

-- settle (a reservation's actual cost: nested.lua; sliding_log.settle): cost is the delta;
-- ARGV after the rates holds since_ms, debt and the charge's reset_ms (unused). A refund
-- removes up to -delta entries stamped since_ms while they are in the window; an extra
-- appends entries at now, up to count + debt in the window.
if op == 'settle' then
  local since, debt = ARGV[3 * N + 4], tonumber(ARGV[3 * N + 5])
  for i = 1, N do
    local count, period = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
    local key = list(i)
    if cost < 0 then
      if tonumber(since) > now - period and redis.call('LREM', key, -cost, since) > 0 then
        expire(key, period)
      end
    else
      local len = redis.call('LLEN', key)
      local live = len - expired(key, len, now - period)
      local take = math.min(cost, math.max(0, count + debt - live))
      if take > 0 then
        add(key, take)
        expire(key, period)
      end
    end
  end
  return {}
end

local reply, all_allowed, old, room = {}, true, {}, {}
for i = 1, N do
  local count, period = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local key = list(i)
  local len = redis.call('LLEN', key)
  local gone = expired(key, len, now - period)
  local live = len - gone
  old[i] = gone
  if op == 'debit' then
    room[i] = math.max(0, math.min(cost, 3 * count - live))
  elseif op ~= 'refund' and op ~= 'credit' then
    local allowed = live + cost <= count
    local retry = 0
    if not allowed then
      all_allowed = false
      if cost > count then
        retry = -1
      else
        retry = at(key, gone + live + cost - count - 1) + period - now
      end
    end
    local last = nil
    if live > 0 then
      last = at(key, -1)
    end
    if allowed and op == 'hit' then
      live = live + cost
      last = math.max(last or now, now)
    end
    local reset = now
    if last then
      reset = math.max(now, last + period)
    end
    local n = #reply
    reply[n + 1] = allowed and 1 or 0
    reply[n + 2] = math.max(0, count - live)
    reply[n + 3] = reset
    reply[n + 4] = retry
  end
end

if op == 'peek' then
  return reply
end
for i = 1, N do
  local key, period = KEYS[i], tonumber(ARGV[3 * i + 2])
  if old[i] > 0 then
    redis.call('LTRIM', key, old[i], -1)
  end
  if op == 'debit' then
    if room[i] > 0 then
      add(key, room[i])
      expire(key, period)
    end
  elseif op == 'refund' or op == 'credit' then
    local len = redis.call('LLEN', key)
    if len > 0 then
      redis.call('RPOP', key, math.min(cost, len))
      expire(key, period)
    end
  elseif all_allowed then
    add(key, cost)
    expire(key, period)
  end
end
return reply
