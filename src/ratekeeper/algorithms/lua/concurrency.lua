-- concurrency: leases of requests in progress, in one sorted set per caller key.
--
-- KEYS[1]  the sorted set: member = lease id, score = epoch ms at which the lease expires
-- ARGV[1]  op: "acquire" | "release" | "count"
-- ARGV[2]  now_ms      epoch ms by the caller's clock (acquire, release, count)
-- ARGV[3]  lease id    (acquire, release)
-- ARGV[4]  capacity    most live leases (acquire)
-- ARGV[5]  expires_ms  epoch ms at which the new lease expires (acquire)
-- ARGV[6]  ttl_ms      relative key TTL in ms, only for cleanup (acquire)
--
-- acquire: drop expired leases, count the rest, add the new one if count < capacity; the
--          sweep, the check and the add are one atomic step. Reply {acquired 0|1, live count}.
-- release: ZREM the lease. Reply {1 if it was live (score > now_ms) else 0, members left}:
--          an expired lease is removed too, but had already stopped counting.
-- count:   live leases (score > now_ms), writing nothing. Reply {0, count}.
local key = KEYS[1]
local op = ARGV[1]

if op == "acquire" then
  local now_ms = tonumber(ARGV[2])
  local capacity = tonumber(ARGV[4])
  redis.call("ZREMRANGEBYSCORE", key, "-inf", now_ms)
  local count = redis.call("ZCARD", key)
  if count >= capacity then
    return {0, count}
  end
  redis.call("ZADD", key, tonumber(ARGV[5]), ARGV[3])
  local ttl_ms = tonumber(ARGV[6])
  if redis.call("PTTL", key) < ttl_ms then
    redis.call("PEXPIRE", key, ttl_ms)
  end
  return {1, count + 1}
elseif op == "release" then
  local score = redis.call("ZSCORE", key, ARGV[3])
  local live = 0
  if score and tonumber(score) > tonumber(ARGV[2]) then
    live = 1
  end
  redis.call("ZREM", key, ARGV[3])
  return {live, redis.call("ZCARD", key)}
elseif op == "count" then
  return {0, redis.call("ZCOUNT", key, "(" .. ARGV[2], "+inf")}
end
return redis.error_reply("concurrency.lua: unknown op " .. tostring(op))
