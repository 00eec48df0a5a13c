-- layout_compact.lua: the compact key layout (stores/redis/layout.py). Prepended (after integer.lua)
-- to an algorithm's script in place of layout_keys.lua. KEYS[i] is a small hash holding rate
-- i's states of many caller keys (listpack-encoded while small); the caller's field is the last
-- ARGV. The same four names as layout_keys.lua:
--   load(i)               HGET of the caller's field
--   save(i, value, ttl)   HSET; a new field also sweeps a few random fields of the hash whose
--                         state has stopped mattering (stale); a hash TTL below ttl is raised
--                         to ttl + max(ttl, 60 s), so it is rarely rewritten
--   add(i, delta)         HINCRBY in place
--   stale(i, raw)         set by the algorithm: true when a stored value no longer matters at
--                         now for rate i (it decides exactly like a missing one)
-- Expiry stays the app's: every state carries its own end, compared with now by the algorithm.
-- The hash TTL only removes a hash no caller has written for longer than its longest state.

local FIELD = ARGV[#ARGV]
local stale

local function load(i)
  return redis.call('HGET', KEYS[i], FIELD)
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
  ttl = tonumber(ttl)
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, string.format('%d', ttl + math.max(ttl, 60000)))
  end
end

local function add(i, delta)
  redis.call('HINCRBY', KEYS[i], FIELD, delta)
end
