-- admin.lua: an admin's reset, credit or debit of one caller key, and its state before and
-- after, in one atomic call. Appended to an algorithm's twin wrapped as `run(ARGV)` (the twin's
-- code unchanged, its ARGV a parameter; stores/redis_codec.admin_script).
-- KEYS, ARGV  as the twin's; ARGV[1] is "reset", "credit" or "debit", ARGV[3] the units.
-- Reply       the twin's peek of nothing (cost 0) before the change, then the same after:
--             8 integers per rate.

local function peek()
  local args = {}
  for j = 1, #ARGV do
    args[j] = ARGV[j]
  end
  args[1], args[3] = 'peek', '0'
  return run(args)
end

local before = peek()
if ARGV[1] == 'reset' then
  for i = 1, N do
    drop(i)
  end
elseif ARGV[1] == 'credit' or ARGV[1] == 'debit' then
  run(ARGV)
else
  return redis.error_reply('admin op ' .. tostring(ARGV[1]) .. ' is unknown')
end
local after = peek()
for j = 1, #after do
  before[#before + 1] = after[j]
end
return before
