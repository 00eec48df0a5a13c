-- value_fixed_window.lua: fixed_window's stored value, encoded in this one place. Prepended
-- (after the layout) to fixed_window.lua, and to slices.lua and the nested script, which read
-- and write the same keys (stores/redis/codec.VALUES).
-- One decimal "<count><end_ms as 13 digits>" (count left out when 0), an integer to Redis
-- while it fits in 64 bits; "<count>:<end_ms>" when end_ms is outside 0..10**13-1 or the count
-- is below zero. window_decode(nil) is nil, nil (no state).

-- "<count><13-digit end>" as a number below 10**15 (< 2**53, exact) -> count, end: the
-- division is corrected for the rounding of v / 1e13
local function split(v)
  local used = math.floor(v / 1e13)
  local ends = v - used * 1e13
  if ends < 0 then
    used, ends = used - 1, ends + 1e13
  elseif ends >= 1e13 then
    used, ends = used + 1, ends - 1e13
  end
  return used, ends
end

local function window_decode(raw)
  if not raw then
    return nil, nil
  end
  local n = #raw
  if n <= 15 then -- the usual case, below 10**15 (< 2**53): split the number itself
    local v = tonumber(raw)
    if v then
      return split(v)
    end
  end
  local sep = string.find(raw, ':', 1, true)
  if sep then
    return tonumber(string.sub(raw, 1, sep - 1)), tonumber(string.sub(raw, sep + 1))
  end
  if n <= 13 then
    return 0, tonumber(raw)
  end
  return tonumber(string.sub(raw, 1, n - 13)), tonumber(string.sub(raw, n - 12))
end

local function window_encode(used, ends)
  if ends >= 0 and ends < 1e13 and used >= 0 then
    if used == 0 then
      return string.format('%013d', ends)
    end
    return string.format('%d%013d', used, ends)
  end
  return string.format('%d:%d', used, ends)
end
