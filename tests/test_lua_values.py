"""The stored values of fixed_window, token_bucket and gcra, each encoded once, in
``lua/value_<name>.lua``.

The twins, ``slices.lua`` and the nested script all read and write these bytes; keys written
by an earlier release must keep reading, so the encodings are pinned here, byte for byte, on a
real Redis running the file as the scripts load it.
"""

from __future__ import annotations

from importlib import resources

import pytest
import redis

from ratekeeper import Limiter, ManualClock, RedisStore
from ratekeeper.stores.redis.codec import VALUES, script
from ratekeeper.stores.redis.nested_codec import nested_script
from ratekeeper.stores.slice_calls import SLICES

LUA = resources.files("ratekeeper.algorithms").joinpath("lua")
VALUE_LUA = {name: LUA.joinpath(f"value_{name}.lua").read_text("utf-8") for name in VALUES}
ALL_VALUES = "".join(VALUE_LUA.values())
NOW_MS = 1_700_000_000_000

# (encoder, its arguments, the stored value)
ENCODED = [
    ("window_encode", (0, NOW_MS + 60_000), "1700000060000"),
    ("window_encode", (3, NOW_MS + 60_000), "31700000060000"),
    ("window_encode", (922_335, NOW_MS + 60_000), "9223351700000060000"),
    ("window_encode", (0, 5), "0000000000005"),
    ("window_encode", (-2, NOW_MS), "-2:1700000000000"),
    ("window_encode", (5, 10**13), "5:10000000000000"),
    ("bucket_encode", (0, NOW_MS + 60_000), "000000060000"),
    ("bucket_encode", (120_000, NOW_MS + 60_000), "120000000000060000"),
    ("bucket_encode", (7, 1_600_000_000_000), "7:1600000000000"),
    ("bucket_encode", (7, NOW_MS + 10**12), "7:2700000000000"),
    ("gcra_encode", (NOW_MS * 1000, 5), "51700000000000000"),
    ("gcra_encode", (12, 1), "10000000000000012"),
    ("gcra_encode", (NOW_MS * 1000, 922), "1700000000000000:922"),
    ("gcra_encode", (10**16, 5), "10000000000000000:5"),
]
DECODER = {"window_encode": "window_decode", "bucket_encode": "bucket_decode"}
DECODER["gcra_encode"] = "gcra_decode"

DRIVER = """
local function s(x)
  if x == nil then
    return 'nil'
  end
  return string.format('%d', x)
end
local a, b = tonumber(ARGV[2]), tonumber(ARGV[3])
local encode = {window_encode = window_encode, bucket_encode = bucket_encode,
  gcra_encode = gcra_encode}
local decode = {window_decode = window_decode, bucket_decode = bucket_decode,
  gcra_decode = gcra_decode}
if ARGV[1] == 'encode' then
  return encode[ARGV[4]](a, b)
end
local x, y = decode[ARGV[4]](ARGV[2])
return s(x) .. ',' .. s(y)
"""


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url, decode_responses=True)


@pytest.mark.parametrize(("encoder", "args", "value"), ENCODED)
def test_each_value_is_pinned_and_reads_back(
    client: redis.Redis, encoder: str, args: tuple[int, int], value: str
) -> None:
    run = ALL_VALUES + DRIVER
    assert client.eval(run, 0, "encode", *args, encoder) == value
    assert client.eval(run, 0, "decode", value, 0, DECODER[encoder]) == f"{args[0]},{args[1]}"


@pytest.mark.parametrize(
    ("decoder", "value", "read"),
    [
        ("window_decode", "9223351700000060000", "922335,1700000060000"),
        ("window_decode", "1700000060000", "0,1700000060000"),
        ("bucket_decode", "60000", "0,1700000060000"),
        ("gcra_decode", "1700000000036000", "1700000000036000,nil"),  # 0.1's tat alone
    ],
)
def test_older_and_short_values_read(
    client: redis.Redis, decoder: str, value: str, read: str
) -> None:
    assert client.eval(ALL_VALUES + DRIVER, 0, "decode", value, 0, decoder) == read


def test_every_script_that_reads_a_value_carries_its_one_file() -> None:
    for name, value in VALUE_LUA.items():
        for layout in ("keys", "compact"):
            assert script(name, layout).source.count(value) == 1
            assert nested_script(layout).source.count(value) == 1
        others = [v for n, v in VALUE_LUA.items() if n != name]
        assert not any(v in script(name).source for v in others)  # only what it uses
        assert value not in script("sliding_window").source
        assert SLICES[0].count(value) == 1


@pytest.mark.parametrize(
    ("algorithm", "value"),
    [
        ("fixed_window", f"2{NOW_MS + 60_000:013d}"),
        ("token_bucket", f"{2 * 60_000}{0:012d}"),  # 2 tokens missing x period, at NOW_MS
        ("gcra", f"5{NOW_MS * 1000 + 24_000_000:016d}"),  # two intervals of 12 s ahead
    ],
)
def test_a_hit_stores_the_pinned_bytes(redis_url: str, algorithm: str, value: str) -> None:
    limiter = Limiter(RedisStore(redis_url), clock=ManualClock(NOW_MS / 1000), fail_open=False)
    assert limiter.hit("user:1", "5/minute", algorithm=algorithm, cost=2).allowed
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    (key,) = client.keys("*")
    assert client.get(key) == value
