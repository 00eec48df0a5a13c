-- layout_keys.lua: the default key layout, one Redis key per rate and caller key. Prepended
-- (after integer.lua) to every algorithm's script run with it (stores/redis_codec.script).
-- KEYS[i] is rate i's own key; the algorithm reads and writes its state only through these:
--   load(i)               the stored value, or nil
--   save(i, value, ttl)   store the value; ttl (ms, relative) only cleans up an idle key
--   add(i, delta)         INCRBY in place (fixed_window's live window: keeps the TTL)
--   keep(i, ttl)          make the state last at least ttl ms more (PEXPIRE GT): a rejection
--                         under a lowered limit, whose state now matters longer than written
--   drop(i)               forget the state (an admin's reset), under the old name too
--   stale                 set by the algorithm; unused here (the compact layout sweeps with it)
--   adopt                 set by an algorithm whose 0.1 value differs: old value -> new one
-- With LEGACY (stack.lua), load reads a state missing under its name from its 0.1 name
-- (KEYS[N + i]), converted by adopt, and (outside a read-only peek) writes it under its name
-- with the old key's TTL, so that add finds it; the old key stays until its TTL.

local adopt

local function load(i)
  local raw = redis.call('GET', KEYS[i])
  if raw or not LEGACY then
    return raw
  end
  local old = KEYS[N + i]
  raw = redis.call('GET', old)
  if raw then
    if adopt then
      raw = adopt(i, raw)
    end
    if ARGV[1] ~= 'peek' then
      redis.call('SET', KEYS[i], raw, 'PX', math.max(1000, redis.call('PTTL', old)))
    end
  end
  return raw
end

local function save(i, value, ttl)
  redis.call('SET', KEYS[i], value, 'PX', ttl)
end

local function add(i, delta)
  redis.call('INCRBY', KEYS[i], delta)
end

local function keep(i, ttl)
  redis.call('PEXPIRE', KEYS[i], ttl, 'GT')
end

local function drop(i)
  redis.call('DEL', KEYS[i])
  if LEGACY then
    redis.call('DEL', KEYS[N + i])
  end
end

local stale
