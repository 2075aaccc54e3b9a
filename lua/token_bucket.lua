--[[
tollgate token bucket: one atomic step of a global token bucket.

KEYS[1]  the bucket key, "<key_prefix>:{<rule>:<digest>}" (one hash-tagged key: works on Redis Cluster).
ARGV[1]  burst       bucket capacity in tokens                     (integer >= 1)
ARGV[2]  rate        tokens added every period_ms                  (integer >= 1, <= 1e9)
ARGV[3]  period_ms   refill period in milliseconds                 (integer >= 1, burst*period_ms <= 2^50)
ARGV[4]  cost        tokens this request needs                     (integer >= 0; 0 only settles)
ARGV[5]  lease_want  tokens the caller would like to take (lease mode; 0 in exact mode; integer >= 0)
ARGV[6]  optional: max_wait_ms (default 0, <= 3600000): when the tokens are not there now but
         would be within this many ms, RESERVE them (the bucket goes into debt) and answer allowed
         with the delay the caller must hold the request for.
ARGV[7]  optional: settle (default 0): tokens to charge (> 0) or refund (< 0) first, for usage
         measured after earlier admissions; |settle| <= 4 * burst. A charge may take the bucket
         into debt, down to -4 bursts; a refund never fills it past full.
ARGV[8]  optional: now in microseconds (tests only). Without it the time is Redis' TIME.
Every ARGV is a plain decimal integer (digits only, at most 2^53); settle may have a leading '-'.

Returns a FLAT array of integers (Webdis turns nested arrays into null):
  { allowed (1|0), remaining (whole tokens left, 0 while in debt),
    retry_after_ms (allowed: 0, or the delay of a reservation; denied: ms until `cost` could be
    reserved within max_wait_ms (until it is there, when max_wait_ms is 0); -1 when cost > burst:
    never admissible),
    reset_after_ms (time until the bucket is full again), granted (tokens taken: >= cost when
    allowed, up to max(cost, lease_want) capped by burst and the tokens held, exactly cost for a
    reservation; 0 when denied; a cost of 0 is always allowed and takes nothing) }
Bad arguments give the error reply "ERR tollgate: bad argument <name>".

Arithmetic is on integers only (Lua numbers are doubles: every value here stays below 2^53).
One token is period_ms units; the bucket gains `rate` units per whole millisecond, so refill is exact.
State: a hash at KEYS[1] with u (units held; negative while reservations are outstanding), t (microsecond timestamp of the last refill point) and
p (the period_ms the units are scaled by). A missing key is a FULL bucket, so the key is deleted when
full and otherwise expires (PEXPIRE) once it would be full again (reset_after_ms + 1 s of slack).
src/bucket.rs is the Rust model of this script; tests/model.rs checks they agree bit for bit.
]]

local MAX_EXACT = 9007199254740992 -- 2^53
local MAX_FULL = 1125899906842624 -- 2^50
local MAX_RATE = 1000000000
local MAX_WAIT_MS = 3600000 -- with rate <= 1e9 the deepest debt stays below 2^53
-- Added to the key's PEXPIRE. Expiring late is invisible (a stale key refills to full, the same as an
-- absent one); expiring early would hand out tokens, and Redis was seen expiring a key with PEXPIRE 1
-- inside the very script that set it (PTTL -2 right after, redis 7.0.15, under load).
local EXPIRE_SLACK_MS = 1000

-- Exact floor division of non-negative integers a, b (b >= 1).
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function ceil_div(a, b)
  return idiv(a + b - 1, b)
end

-- A decimal integer in [min, 2^53], or nil.
local function int_arg(s, min)
  if type(s) ~= 'string' or not string.match(s, '^%d+$') or string.len(s) > 16 then
    return nil
  end
  local n = tonumber(s)
  if n == nil or n < min or n > MAX_EXACT or n ~= math.floor(n) then
    return nil
  end
  return n
end

-- Integral doubles as plain decimal text (tostring would give "1e+15").
local function fmt(n)
  return string.format('%.0f', n)
end

local function bad(name)
  return redis.error_reply('ERR tollgate: bad argument ' .. name)
end

local key = KEYS[1]
if key == nil then
  return bad('key')
end
local burst = int_arg(ARGV[1], 1)
if burst == nil then return bad('burst') end
local rate = int_arg(ARGV[2], 1)
if rate == nil or rate > MAX_RATE then return bad('rate') end
local period_ms = int_arg(ARGV[3], 1)
if period_ms == nil then return bad('period_ms') end
if burst > idiv(MAX_FULL, period_ms) then return bad('burst*period_ms') end
local cost = int_arg(ARGV[4], 0)
if cost == nil then return bad('cost') end
local lease_want = int_arg(ARGV[5], 0)
if lease_want == nil then return bad('lease_want') end
local max_wait_ms = 0
if ARGV[6] ~= nil then
  max_wait_ms = int_arg(ARGV[6], 0)
  if max_wait_ms == nil or max_wait_ms > MAX_WAIT_MS then return bad('max_wait_ms') end
end

local settle = 0
if ARGV[7] ~= nil then
  local magnitude = ARGV[7]
  local sign = 1
  if type(magnitude) == 'string' and string.sub(magnitude, 1, 1) == '-' then
    magnitude = string.sub(magnitude, 2)
    sign = -1
  end
  settle = int_arg(magnitude, 0)
  if settle == nil or settle > 4 * burst then return bad('settle') end
  settle = sign * settle
end

local now
if ARGV[8] ~= nil then
  now = int_arg(ARGV[8], 0)
  if now == nil then return bad('now') end
else
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end

-- 1. Load (absent or unreadable = full), rescale to this period_ms, clamp to burst.
local full = burst * period_ms
local h = redis.call('HMGET', key, 'u', 't', 'p')
local u = tonumber(h[1])
local t = tonumber(h[2])
local p = tonumber(h[3])
if u == nil or t == nil or p == nil or t < 0 or p < 1
    or u ~= math.floor(u) or t ~= math.floor(t) or p ~= math.floor(p) then
  u = full
  t = now
elseif p ~= period_ms then
  if u < 0 then
    -- Debt: rescale by whole tokens, rounding the debt up, never down; at most four bursts deep
    -- under the new limits, so every value stays exact.
    u = math.max(-(ceil_div(-u, p) * period_ms), -4 * full)
  elseif u <= idiv(MAX_EXACT, period_ms) then
    u = idiv(u * period_ms, p)
  else
    -- u * period_ms could pass 2^53: drop the partial token instead (rounds down, never up).
    u = idiv(u, p) * period_ms
  end
end
if u > full then
  u = full
end

-- 2. Refill by whole milliseconds; t keeps the sub-millisecond remainder, so there is no drift.
if now < t then
  t = now -- the clock went back: no refill
else
  local elapsed_ms = idiv(now - t, 1000)
  if elapsed_ms > 0 then
    local to_full = ceil_div(full - u, rate)
    if elapsed_ms >= to_full then
      u = full
      t = now
    else
      u = u + elapsed_ms * rate
      t = t + elapsed_ms * 1000
    end
  end
end

-- 2b. Settle usage measured after earlier admissions: a charge may go into debt (at most 4 bursts
-- deep, so every value stays exact), a refund never fills the bucket past full.
if settle > 0 then
  u = math.max(u - settle * period_ms, -4 * full)
elseif settle < 0 then
  u = math.min(u - settle * period_ms, full)
end

-- 3. Decide.
local allowed, granted, retry_after_ms
if cost == 0 then
  allowed, granted, retry_after_ms = 1, 0, 0
elseif cost > burst then
  allowed, granted, retry_after_ms = 0, 0, -1
elseif u >= cost * period_ms then
  local want = math.min(math.max(cost, lease_want), burst)
  granted = math.min(want, idiv(u, period_ms))
  u = u - granted * period_ms
  allowed, retry_after_ms = 1, 0
else
  local wait_ms = ceil_div(cost * period_ms - u, rate)
  if wait_ms <= max_wait_ms then
    -- Reserve: the bucket goes into debt, paid back by refill within max_wait_ms. The caller
    -- holds the request for retry_after_ms, when those tokens exist.
    u = u - cost * period_ms
    allowed, granted, retry_after_ms = 1, cost, wait_ms
  else
    -- retry_after_ms: until the wait would fit in max_wait_ms (until cost is there, if 0).
    allowed, granted = 0, 0
    retry_after_ms = wait_ms - max_wait_ms
  end
end

-- 4. Report.
local remaining = 0
if u > 0 then
  remaining = idiv(u, period_ms)
end
local reset_after_ms = ceil_div(full - u, rate)

-- 5. Store: a full bucket is no key at all.
if u >= full then
  redis.call('DEL', key)
else
  redis.call('HSET', key, 'u', fmt(u), 't', fmt(t), 'p', fmt(period_ms))
  redis.call('PEXPIRE', key, fmt(reset_after_ms + EXPIRE_SLACK_MS))
end

return { allowed, remaining, retry_after_ms, reset_after_ms, granted }
