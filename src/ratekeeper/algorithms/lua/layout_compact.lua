-- layout_compact.lua: the compact key layout (stores/redis/layout.py). Prepended (after integer.lua)
-- to an algorithm's script in place of layout_keys.lua. KEYS[i] is a small hash holding rate
-- i's states of many caller keys (listpack-encoded while small); the caller's field is the last
-- ARGV. The same four names as layout_keys.lua:
--   load(i)               HGET of the caller's field
--   save(i, value, ttl)   HSET; a new field also sweeps a few random fields of the hash whose
--                         state has stopped mattering (stale); a hash TTL below ttl is raised
--                         to ttl + max(ttl, 60 s), so it is rarely rewritten
--   add(i, delta)         HINCRBY in place
--   keep(i, ttl)          raise the hash's TTL to cover ttl as save does, without a write
--   drop(i)               HDEL of the caller's field (an admin's reset)
--   stale(i, raw)         set by the algorithm: true when another caller's stored value no
--                         longer matters at now under any rate of rate i's window (it decides
--                         exactly like a missing one whatever the count: the hash is named by
--                         the window, and the caller's count need not be the writer's)
-- Expiry stays the app's: every state carries its own end, compared with now by the algorithm.
-- The hash TTL only removes a hash no caller has written for longer than its longest state.
-- With LEGACY (stack.lua), load reads a field missing from its hash from the 0.1 hash of the
-- same bucket (KEYS[N + i]), converted by adopt, and (outside a peek) writes it, as
-- layout_keys.lua does.

local FIELD = ARGV[#ARGV]
local stale, adopt, keep

local function load(i)
  local raw = redis.call('HGET', KEYS[i], FIELD)
  if raw or not LEGACY then
    return raw
  end
  local old = KEYS[N + i]
  raw = redis.call('HGET', old, FIELD)
  if raw then
    if adopt then
      raw = adopt(i, raw)
    end
    if ARGV[1] ~= 'peek' then
      redis.call('HSET', KEYS[i], FIELD, raw)
      keep(i, string.format('%d', math.max(1000, redis.call('PTTL', old))))
    end
  end
  return raw
end

keep = function(i, ttl)
  local key = KEYS[i]
  ttl = tonumber(ttl)
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, string.format('%d', ttl + math.max(ttl, 60000)))
  end
end

local function save(i, value, ttl)
  local key = KEYS[i]
  if redis.call('HSET', key, FIELD, value) == 1 then -- a new field: sweep a few others
    local sample = redis.call('HRANDFIELD', key, 3, 'WITHVALUES')
    for j = 1, #sample, 2 do
      if sample[j] ~= FIELD and stale(i, sample[j + 1]) then
        redis.call('HDEL', key, sample[j])
      end
    end
  end
  keep(i, ttl)
end

local function drop(i)
  redis.call('HDEL', KEYS[i], FIELD)
  if LEGACY then
    redis.call('HDEL', KEYS[N + i], FIELD)
  end
end

local function add(i, delta)
  redis.call('HINCRBY', KEYS[i], FIELD, delta)
end
