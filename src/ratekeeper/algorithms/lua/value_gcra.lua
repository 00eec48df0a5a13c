-- value_gcra.lua: gcra's stored value, encoded in this one place. Prepended (after the layout)
-- to gcra.lua, and to slices.lua and the nested script, which read and write the same keys
-- (stores/redis/codec.VALUES).
-- (tat_us, count) as "<count><tat_us as 16 digits>", an integer to Redis, when count < 922 and
-- tat_us is from 0 to 10**16 - 1 (until 2286); else "<tat_us>:<count>". A tat alone (16 digits
-- or fewer, as 0.1 wrote it) decodes with no count: nothing to convert from.
-- gcra_decode(nil) is nil, nil.

local function gcra_decode(raw)
  if not raw then
    return nil, nil
  end
  local sep = string.find(raw, ':', 1, true)
  if sep then
    return tonumber(string.sub(raw, 1, sep - 1)), tonumber(string.sub(raw, sep + 1))
  end
  local n = #raw
  if n <= 16 then
    return tonumber(raw), nil
  end
  return tonumber(string.sub(raw, n - 15)), tonumber(string.sub(raw, 1, n - 16))
end

local function gcra_encode(tat, count)
  if count < 922 and tat >= 0 and tat < 1e16 then
    return string.format('%d%016d', count, tat)
  end
  return string.format('%d:%d', tat, count)
end
