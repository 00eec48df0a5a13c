-- The Rate Limit Quota Service's step on Redis: allocator.py's twin (same integers).
-- KEYS[1]: the bucket's hash, one field per stream: "demand:assigned:last_ms:expires_ms:orphan"
--          (rates in milli-requests per second, times in epoch ms of the service's clock).
-- ARGV: op ("step" | "drop" | "orphan"), now_ms, stream, then for "step": demand (-1:
--       unknown), limit, hold_ms, cap (-1: none), adopt (0/1), key_ttl_ms; the constants
--       HEADROOM_PCT, BAND_PCT, STALE_MS follow.
-- Reply: "step": {assigned, target, envoys, held}; "drop"/"orphan": 1 if the stream had a
--        record, else 0.
local key = KEYS[1]
local op = ARGV[1]
local now = tonumber(ARGV[2])
local me = ARGV[3]

if op == "drop" then
  return redis.call("HDEL", key, me)
end
if op == "orphan" then
  local v = redis.call("HGET", key, me)
  if not v then return 0 end
  redis.call("HSET", key, me, string.sub(v, 1, -2) .. "1")
  return 1
end

local demand = tonumber(ARGV[4])
local limit = tonumber(ARGV[5])
local hold = tonumber(ARGV[6])
local cap = tonumber(ARGV[7])
local adopt = ARGV[8] == "1"
local key_ttl = tonumber(ARGV[9])
local headroom = tonumber(ARGV[10])
local band = tonumber(ARGV[11])
local stale = now - tonumber(ARGV[12])
local floor = math.floor

local function need(d, fair)
  if d < 0 then return fair end
  return d + floor(d * headroom / 100)
end

local flat = redis.call("HGETALL", key)
local live = {}
local names = {}
local current = 0
for i = 1, #flat, 2 do
  local d, a, l, e, o = string.match(flat[i + 1], "^(-?%d+):(%d+):(%d+):(%d+):(%d)$")
  local r = {d = tonumber(d), a = tonumber(a), l = tonumber(l), e = tonumber(e), o = o == "1"}
  if r.e <= now then
    redis.call("HDEL", key, flat[i])
  elseif flat[i] == me then
    current = r.a
  else
    live[flat[i]] = r
    names[#names + 1] = flat[i]
  end
end
table.sort(names)

if adopt then
  local taken, best = nil, -1
  for _, k in ipairs(names) do
    local r = live[k]
    if (r.o or r.l <= stale) and r.a > best then
      taken, best = k, r.a
    end
  end
  if taken then
    current = current + best
    live[taken] = nil
    redis.call("HDEL", key, taken)
  end
end

local held, fresh = 0, 0
for _, r in pairs(live) do
  held = held + r.a
  if not r.o and r.l > stale then fresh = fresh + 1 end
end
local count = fresh + 1
local fair = floor(limit / count)
local mine = need(demand, fair)
local needs = {mine}
local total = mine
for _, r in pairs(live) do
  if not r.o and r.l > stale then
    local n = need(r.d, fair)
    needs[#needs + 1] = n
    total = total + n
  end
end

local goal
if total <= limit then
  goal = mine + floor((limit - total) / count)
else
  table.sort(needs)
  local remaining = limit
  goal = mine
  for i, n in ipairs(needs) do
    local share = floor(remaining / (count - i + 1))
    if n > share then
      goal = math.min(mine, share)
      break
    end
    remaining = remaining - n
  end
end

local free = limit - held
if free < 0 then free = 0 end
local grant = math.min(goal, free)
if cap >= 0 then grant = math.min(grant, cap) end
if current > 0 and current <= free and (cap < 0 or current <= cap)
    and math.abs(grant - current) * 100 <= band * current then
  grant = current
end
if demand < -1 then demand = -1 end
redis.call("HSET", key, me, string.format("%.0f:%.0f:%.0f:%.0f:0", demand, grant, now, now + hold))
redis.call("PEXPIRE", key, key_ttl)
return {grant, goal, count, held}
