-- integer.lua: exact integer division for the Lua twins; prepended to every algorithm's
-- script when it is loaded (stores/redis_codec.script), so the helpers exist once.
-- Lua has only doubles; every value stays below 2**53, where they are exact, and idiv
-- corrects the rounding of a / b so floor division is exact too (Python's //).

local function idiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

local function ceil_div(a, b)
  return -idiv(-a, b)
end

