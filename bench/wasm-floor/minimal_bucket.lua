-- make peers' wasm-floor-script (bench/wasm-floor, configuration "hold-script <sha>"): the least a
-- shared token bucket per key can do in one script call for a batch of keys, to measure the
-- architecture (a held request, a Webdis callout, a Lua script) without tollgate's own work.
-- KEYS: one bucket key per request; ARGV: burst, rate, period_ms. Returns, per key, 1 or 0
-- (allowed) and the tokens left. Every key expires once it would have refilled.
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local burst, rate, period = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl = math.ceil(burst * period / rate) + 1000
local out = {}
for i = 1, #KEYS do
  local h = redis.call('HMGET', KEYS[i], 'u', 't')
  local u, t = tonumber(h[1]), tonumber(h[2])
  if u == nil or t == nil or t > now then
    u, t = burst, now
  else
    local add = math.floor((now - t) * rate / period)
    if add > 0 then
      u = math.min(burst, u + add)
      t = now
    end
  end
  local allowed = 0
  if u >= 1 then
    u = u - 1
    allowed = 1
  end
  redis.call('HSET', KEYS[i], 'u', u, 't', t)
  redis.call('PEXPIRE', KEYS[i], ttl)
  out[#out + 1] = allowed
  out[#out + 1] = u
end
return out
