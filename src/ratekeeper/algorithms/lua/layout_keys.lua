-- layout_keys.lua: the default key layout, one Redis key per rate and caller key. Prepended
-- (after integer.lua) to every algorithm's script run with it (stores/redis_codec.script).
-- KEYS[i] is rate i's own key; the algorithm reads and writes its state only through these:
--   load(i)               the stored value, or nil
--   save(i, value, ttl)   store the value; ttl (ms, relative) only cleans up an idle key
--   add(i, delta)         INCRBY in place (fixed_window's live window: keeps the TTL)
--   stale                 set by the algorithm; unused here (the compact layout sweeps with it)

local function load(i)
  return redis.call('GET', KEYS[i])
end

local function save(i, value, ttl)
  redis.call('SET', KEYS[i], value, 'PX', ttl)
end

local function add(i, delta)
  redis.call('INCRBY', KEYS[i], delta)
end

local stale
