-- fixed_window: the Lua twin of algorithms/fixed_window.py (same integer arithmetic).
--
-- KEYS[i]  rate i's key; every key of one call shares the caller's hash tag.
-- ARGV     op ("hit" | "peek" | "refund"), now_ms, cost,
--          then per rate i: count, period_ms, extra (unused: 0).
-- Value    one decimal: "<count><end_ms as 13 digits>" (count left out when 0), which Redis
--          stores as an integer when it fits in 64 bits; "<count>:<end_ms>" when end_ms is
--          outside 0..10**13-1. Times are epoch ms from the caller's clock (never Redis TIME).
-- Expiry   a window ends by its stored end, never by TTL; every write sets a relative
--          PEXPIRE of end_ms - now_ms + 1000 so idle keys vanish.
-- Reply    hit/peek: 4 integers per rate: allowed (1/0), remaining, reset_ms, retry_ms (-1 for
--          never); refund: an empty array. peek never writes (it runs as EVALSHA_RO).

local op, now, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local function decode(raw)
  if not raw then
    return nil, nil
  end
  local sep = string.find(raw, ':', 1, true)
  if sep then
    return tonumber(string.sub(raw, 1, sep - 1)), tonumber(string.sub(raw, sep + 1))
  end
  local n = #raw
  if n <= 13 then
    return 0, tonumber(raw)
  end
  return tonumber(string.sub(raw, 1, n - 13)), tonumber(string.sub(raw, n - 12))
end

local function encode(used, ends)
  if ends >= 0 and ends < 1e13 then
    if used == 0 then
      return string.format('%013d', ends)
    end
    return string.format('%d%013d', used, ends)
  end
  return string.format('%d:%d', used, ends)
end

local function ttl(ends)
  return string.format('%d', math.max(1000, ends - now + 1000))
end

local reply, writes, all_allowed = {}, {}, true
for i = 1, #KEYS do
  local count, period = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local used, ends = decode(redis.call('GET', KEYS[i]))
  if op == 'refund' then
    if used and ends > now then
      writes[i] = encode(math.max(0, used - cost), ends)
      writes[-i] = ttl(ends)
    end
  else
    if not used or ends <= now then
      used, ends = 0, now + period
    end
    local allowed = used + cost <= count
    if allowed and op == 'hit' then
      used = used + cost
      writes[i] = encode(used, ends)
      writes[-i] = ttl(ends)
    end
    local retry = 0
    if not allowed then
      all_allowed = false
      retry = (cost <= count) and (ends - now) or -1
    end
    local n = #reply
    reply[n + 1] = allowed and 1 or 0
    reply[n + 2] = math.max(0, count - used)
    reply[n + 3] = ends
    reply[n + 4] = retry
  end
end

if op == 'refund' or (op == 'hit' and all_allowed) then
  for i = 1, #KEYS do
    if writes[i] then
      redis.call('SET', KEYS[i], writes[i], 'PX', writes[-i])
    end
  end
end
return reply
