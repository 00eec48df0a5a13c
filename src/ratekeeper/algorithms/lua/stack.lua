-- stack.lua: the size of the stack, prepended to every algorithm's script
-- (stores/redis_codec.script). N rates: ARGV is op, now_ms, cost, three values per rate (and,
-- in the compact layout, one field), so N = floor((#ARGV - 3) / 3) in both layouts.
-- KEYS[1..N] are the rates' keys. LEGACY: KEYS[N+1..2N] follow, the same states under the
-- names of ratekeeper 0.1 (the rate's count in the key: rk{k}f:100/1m), read when a key has no
-- state under its own name yet and carried over (the store's legacy_keys option).

local N = math.floor((#ARGV - 3) / 3)
local LEGACY = #KEYS > N
