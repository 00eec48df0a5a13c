-- value_token_bucket.lua: token_bucket's stored value, encoded in this one place. Prepended
-- (after the layout) to token_bucket.lua, and to slices.lua and the nested script, which read
-- and write the same keys (stores/redis/codec.VALUES).
-- (debt, updated_ms) as one decimal "<debt><updated_ms - BUCKET_EPOCH as 12 digits>" (debt
-- left out when 0); "<debt>:<updated_ms>" when updated_ms is before 2023-11-14 or after 2055.
-- Times as ms since the epoch 1.7e12 leave 7 digits of a 64-bit integer for the debt: a bucket
-- one request short of 10/hour or 1000/minute stays an integer. bucket_decode(nil) is nil, nil.

local BUCKET_EPOCH = 1700000000000

local function bucket_decode(raw)
  if not raw then
    return nil, nil
  end
  local sep = string.find(raw, ':', 1, true)
  if sep then
    return tonumber(string.sub(raw, 1, sep - 1)), tonumber(string.sub(raw, sep + 1))
  end
  local n = #raw
  if n <= 12 then
    return 0, tonumber(raw) + BUCKET_EPOCH
  end
  return tonumber(string.sub(raw, 1, n - 12)), tonumber(string.sub(raw, n - 11)) + BUCKET_EPOCH
end

local function bucket_encode(debt, time_ms)
  local since = time_ms - BUCKET_EPOCH
  if since >= 0 and since < 1e12 then
    if debt == 0 then
      return string.format('%012d', since)
    end
    return string.format('%d%012d', debt, since)
  end
  return string.format('%d:%d', debt, time_ms)
end
