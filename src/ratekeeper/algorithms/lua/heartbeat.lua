-- heartbeat: the Lua twin of algorithms/heartbeat.py, the processes that share a store.
--
-- KEYS[1]  a sorted set: member = process id, score = epoch ms at which it stops counting
-- ARGV     now_ms, process id, expires_ms (0: the process leaves now)
-- Expiry   members whose score is not after now_ms are dropped on every call; the key gets a
--          relative TTL of the latest expiry - now_ms + 1000 (cleanup only).
-- Reply    the number of live members, the caller included unless it left.

local key, now, id, expires = KEYS[1], tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if expires > 0 then
  redis.call('ZADD', key, expires, id)
  local ttl = expires - now + 1000
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
else
  redis.call('ZREM', key, id)
end
return redis.call('ZCARD', key)
