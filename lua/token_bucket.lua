--[[
tollgate token bucket: one atomic step of a global token bucket (the single form), or one step of
each of several buckets in order (the batched form, below).

KEYS[1]  the bucket key, "<key_prefix>:{<rule>:<digest>}" (one hash-tagged key: works on Redis Cluster).
ARGV[1]  burst       bucket capacity in tokens                     (integer >= 1)
ARGV[2]  rate        tokens added every period_ms                  (integer >= 1, <= 1e9)
ARGV[3]  period_ms   refill period in milliseconds                 (integer >= 1; see "Units and steps")
ARGV[4]  cost        tokens this request needs                     (integer >= 0; 0 only settles)
ARGV[5]  lease       "0" (exact mode), or "<want>:<holder>:<seq>:<hold_ms>:<held>:<quiet_ms>" with up
         to seven more ":<held>:<quiet_ms>" steps (lease mode): the proxy `holder` (an integer
         >= 1, random per proxy) would like up to `want` tokens, may hold what it is granted for
         at most hold_ms after any reservation in it refilled, and for each step has held at most
         `held` tokens of this bucket from earlier grants (spendable or not) for the last quiet_ms
         (all ms <= 86400000; steps oldest first, the last one what it holds now). `seq` (>= 1)
         grows with each lease call the proxy sends for the key: the steps of a call that runs
         after a later one of the same holder are ignored (q<id> keeps the latest seq that ran).
         With an odd count of parts, the fifth is `back`: tokens the holder was granted and
         dropped unspent, which it will never spend; they go back into the bucket, at most what
         its record h<id> counts before this call's steps, never past what the bucket can hold
         (ignored with the steps of a stale call). The script cannot tell spent tokens from
         unspent ones: the bound holds because the caller gives back only tokens it will never
         spend (the filter: a worker's batch dropped unspent, given back once, by the first
         call whose steps no longer count it). Tokens given back after being spent would be
         admitted twice.
         A suffix "/<demand>" after the last step reports the holder's recent demand for the
         key, in thousandths of a token per second (an integer <= 2^32): its share is weighed
         by it (below). Without it the holder reports no demand and gets the equal share.
         A plain integer n is a lease without a holder: up to n tokens granted at once, for a
         caller that spends them at once (the exact checks of a hot key sharing one call, one
         token each; the model tests).
         Or an operator's operation on the bucket (the `tollgate` command; the filter never sends
         one), with cost "0" and no settle; the bucket is first refilled to now as for any call:
           "reset"     the bucket holds all it can again: burst, less the tokens holders hold (they
                       stay on record until they expire), less the tokens still reserved by held
                       requests (at most max_wait_ms (ARGV[6]) of refill of its debt), so what it
                       holds, what is on lease and what is reserved never pass burst together
           "credit:n"  n more tokens (n >= 1), never past what the bucket can hold (burst less
                       what holders hold): a credit repays debt first
ARGV[6]  optional: max_wait_ms (default 0, <= 3600000): when the tokens are not there now but
         would be within this many ms, RESERVE them (the bucket goes into debt) and answer allowed
         with the delay the caller must hold the request for. A call without a holder reserves
         nothing while holders hold tokens of the bucket (below).
ARGV[7]  optional: settle (default 0), applied first, for usage measured after earlier
         admissions: "<charge>", or "<charge>:<refund>:<epoch>:<mark>" (the tracked form), each
         count <= 4 * burst. A charge only lowers the bucket, at most to 4 bursts of debt (a
         bucket already deeper in debt stays where it is). A refund gives tokens back to a
         bucket that tracks its spill epoch (below), as far as the epoch and the mark its take
         was answered with allow, and nothing unless `epoch` is still the bucket's E. The tracked
         form asks the bucket to track (with refund, epoch and mark 0 when there is nothing to
         give back: a take that may be refunded later) and the reply to carry E and this call's
         mark. "-<n>", a refund without an epoch, is accepted and gives back nothing: nothing
         says when its tokens were taken.
ARGV[8]  optional: now in microseconds (tests only), or "time": Redis' TIME, as when it is absent
         (what a caller sends to reach ARGV[9]).
ARGV[9]  optional: the penalty box, "<window_ms>:<ms1>[:<ms2>...]" (absent or "0": none). A denial
         by the bucket (not one while boxed, not cost > burst) is an offence: the n-th offence
         within window_ms of the previous one boxes the key for ms<n> (the last one repeats), and
         while boxed every call with 0 < cost <= burst is denied (retry_after_ms: until the box
         ends), takes nothing and is no new offence (settle still applies first). 1 to 8
         durations, each 1..86400000 ms, non-decreasing; window_ms 1..604800000. State x (boxed
         until, us), c (offences in the window, at most 8), w (the last offence, us); the key is
         neither deleted nor expired while boxed or while its last offence is within the window.
         "reset" (ARGV[5]) empties the box and forgets the offences; "credit:n" leaves them.
Every number is a plain decimal integer (digits only, at most 2^53); settle may have a leading '-'.

The spill epoch (why a refund never breaks "at most burst + rate * W in any window"). A refund
that put tokens back as if they had been banked would be wrong once the bucket has since filled
and spilled refill at its cap: it would hold tokens a bucket that never lost them could not hold.
Let V be what the bucket holds as the window bound counts it (u plus what holders hold), in
units. A bucket that tracks keeps E, the time (us) its current stretch began; N, the units taken
since E (a take's MARK is N after it); and D, full less the most V + N - R has been since E, less
R (R: the units refunds gave back since E). A stretch begins where V is known (N := 0,
D := full - V): when a refill reaches the cap (a spill: the call's takes come after it, at the
same instant), when the bucket is created (a missing key is full), after a reset (tokens an
operator put in were never taken), and, with no refund coming back in that call, when the units
per token change, when t is not the one this version last wrote (T: another version of the
script refilled the bucket without tracking), or when N would pass 2^51. Anything else that
raises V lowers D to full - V - N. A refund of r tokens with epoch e and mark m gives back
x = min(r * units per token, D + min(m, N)) units when e == E and no stretch began earlier in
this call, else nothing; then D := D - x. Why: V + N - R never passed full - D - R since E; N
is at least m from the take on and R only grows, so V never passed full - D - m since the
take; the history where
the take had been x units smaller holds V + x <= full from the take on, never spills, admits the
same requests and is a valid bucket history, which the window bound covers. D := D - x keeps the
bound valid in that history, so refunds of one stretch are each bounded in the history the
earlier ones stand for (a refund of a later take first makes an earlier one's bound smaller:
safe, not tight). The filter gives back a take's tokens at most once: a refund sent twice could
exceed its take. E only grows while the key lives (a new stretch takes max(now, E + 1)); a
deleted key's next E is the now of the call that creates it, which differs from every earlier E
of the key as long as Redis' clock does not repeat a microsecond (explicit ARGV[8] clocks may:
the tests choose theirs). A change of burst needs nothing: D and N are kept below full.
Reservations: the history above admits the same requests, but a request held for a reservation
is released when the refill has repaid the debt its take saw. A refund into a bucket whose debt
is promised to held requests would let a later take reserve a slot one of them already holds
(burst 1, a token a second: A and B reserve the tokens of 1 s and 2 s, A's refund at 0.5 s lets C
reserve the token of 2 s too: B and C at one instant). So the bucket also keeps W, the release
time (us) of its last reservation (a stretch that begins in debt, what came before unknown:
when the refill will have repaid it), and a refund gives back nothing while now < W.

Returns a FLAT array of integers (Webdis turns nested arrays into null):
  { allowed (1|0), remaining (whole tokens left, 0 while in debt),
    retry_after_ms (allowed: 0, or the delay of a reservation, or for a racer's paced grant minus
    the ms to its next turn (below); denied: ms until `cost` could be
    reserved within max_wait_ms (until it is there, when max_wait_ms is 0), or for a holder
    denied its share, the time the bucket takes to refill one share; -1 when cost > burst:
    never admissible),
    reset_after_ms (time until the bucket holds all it can again), granted (tokens taken: >= cost
    when allowed, 0 when denied; a cost of 0 is always allowed and takes nothing) }
  and, only when ARGV[9] names a penalty or ARGV[7] has the tracked form, a 6th: penalized (0:
  not the box's denial; 1: this denial was an offence and boxed the key, retry_after_ms at least
  its duration; 2: denied because the key was already boxed); and, only when ARGV[7] has the
  tracked form, a 7th and an 8th: epoch, the bucket's E after this call, and mark, its N (what a
  refund of its take carries).
An operation ("reset", "credit:n") answers { 1, remaining, 0, reset_after_ms, 0 }: the bucket after it.
Bad arguments give the error reply "ERR tollgate: bad argument <name>".

The batched form: the steps of several keys in one call (one run; each key's step is the single
form's step, atomic, and the keys run in order).
KEYS[1..n]  1 <= n <= 256 bucket keys; the same key may come more than once (its later step sees
            what its earlier one wrote). On a Redis Cluster they must hash to one slot: Redis
            refuses the call (CROSSSLOT) before it runs otherwise.
ARGV        "batch", then for each key in order a count c (5 to 9) and exactly c arguments: that
            key's ARGV[1..c] of the single form (an operator's operation included):
              batch  c1 a1_1 .. a1_c1  c2 a2_1 .. a2_c2  ..  cn an_1 .. an_cn
            or, for any key but the first, the count 0 and no argument: that key's arguments are
            the previous key's (many keys of one rule carry the same limits and cost).
The frame is checked first: an n out of range, a count that is not one digit 5 to 9 (or 0 after
the first key), or arguments not used up exactly give the error reply "ERR tollgate: bad
argument batch", and no key is read or written. Redis' TIME is read once, and is the now of
every key whose arguments give none (an explicit ARGV[8] wins).
Returns a FLAT array of 6 integers per key, in key order: the single form's reply, with
penalized as the 6th (0 when that key has no penalty), and a 7th and 8th, its epoch and mark,
for a key whose count is at least 7 and whose ARGV[7] holds a ':' (the tracked form): so the
reply's length follows from the arguments. A key whose arguments are bad, or whose step raised
an error about that key (WRONGTYPE: not a hash) or an error of the script's own, gets
{ -1, code, 0, 0, 0, 0 } (and 0, 0 when it asked for its epoch) and the others go on. The code names the argument the single form's error
would name: 1 key, 2 burst, 3 rate, 4 period_ms, 5 burst*period_ms, 6 cost, 7 lease, 8 credit,
9 max_wait_ms, 10 settle, 11 now, 12 penalty; 13 is an error while the step ran. A bad argument
writes nothing; what a step wrote before an error stays (as in the single form). An error Redis
raises about the server as a whole (OOM, READONLY, ...: any error but WRONGTYPE) ends the run and
is its error reply, as in the single form; what earlier keys' steps wrote stays (Redis raises OOM
and READONLY only before a run's first write).

Tokens out on lease count against the capacity. The bucket holds at most burst minus what the
holders hold: `o`, the sum of every live holder's `h<id>` (tokens it may still hold; a report only
lowers it, a grant raises it) until `e<id>` (when it must have dropped them). So the bucket and
every token held anywhere together never exceed burst, and the fleet admits at most
burst + rate * W in any window of W ms. Holders together never hold more than burst, so debt
(reservations) always refills at the full rate. A holder gets at most its share, burst divided by
the number of live holders (at least cost), so one proxy cannot hold a key's whole capacity while
others ask. A holder that reports its demand gets, when that is more and the bucket holds at
least half of what it can hold, its part of the burst by demand: burst * d<id> / s, where s is
the sum of every live holder's d<id> (its latest report), at most burst and at most what keeps
every holder's tokens together at half the burst (burst / 2 - what the others hold); so a busy
holder among many quiet ones holds a lease's worth instead of a sliver, a key short of tokens is
shared equally, and a part by demand always comes from what the bucket holds, never a
reservation. Shares only cap what each asks: the bucket and what holders hold together still never
pass burst. A holder whose equal share (burst / holders) is below RACE_SHARE (5) tokens and below
burst reserves nothing, whatever its demand:
it takes what the bucket holds, or is denied until the bucket has refilled a token for every live
holder (retry_after_ms: its turn). Such a racer's part by demand counts whether or not the bucket
holds half of what it can hold, at most burst less what the others hold (their tokens are few
each); and its grant while the bucket holds less than half of what it can hold is paced: the
reply's retry_after_ms is then negative, minus its next turn in ms, the refill time of
granted * floor(s / d<id>) tokens (granted * the live holders, without a demand; at most 2^53
units), so each racer calls at the pace of its part of the rate, not for each token as it
refills (the filter denies the key until then). What a holder gives back (`back`) moves tokens
from what it holds on record to the bucket: the two together never pass burst. A call without a
holder reserves nothing while holders hold tokens (o > 0): it takes what the bucket holds or is
denied (retry_after_ms: until cost is there). A reservation's release time is fixed by the
refill, and a holder may spend what it holds at that very moment: burst 2, a token a second, H
leases both tokens, X reserves the tokens of 2 s, and at 2 s X goes through as H spends its two,
four at one instant.

Units and steps. Arithmetic is on integers only (Lua numbers are doubles: every value here stays
below 2^53). The bucket refills by whole STEPS of step_ms, derived from burst and period_ms:
  step_ms = 1      when burst * period_ms <= 2^50
          = 1000   else, when period_ms is a multiple of 1000 and burst * (period_ms / 1000) <= 2^50
          = 60000  else, when period_ms is a multiple of 60000 and burst * (period_ms / 60000) <= 2^50
and any other (burst, period_ms) is the error "bad argument burst*period_ms". One token is
period_ms / step_ms units (at most 2^50 in a full bucket); the bucket gains `rate` units per whole
step, and t advances by whole steps only (it keeps the remainder), so refill is exact and never
drifts. Every time the script reports (retry_after_ms, reset_after_ms, a reservation's delay) is
when those steps will have come, in ms rounded up (never before the tokens are there), saturated at
2^53 ms (285,000 years). The refill comes in whole steps, so with a step of s the promise "at most
burst + rate * W in any window of W" holds for W rounded up to a whole step.
State: a hash at KEYS[1] with u (units held; negative while reservations are outstanding), t
(microsecond timestamp of the last refill point), p (the units per token u is scaled by: period_ms
when the step is 1 ms), and
while there are holders: o (tokens they hold), k (how many), n and m (the earliest and latest
e<id>), s (the demand they reported, together; absent when none did), h<id>, e<id> and q<id> per
holder, and d<id> (its demand) for a holder that reported one; and while the bucket tracks its
spill epoch: E, D, N, T and W (above). A missing key is a FULL bucket with no holders, so the key is
deleted when full with no holders and otherwise expires (PEXPIRE) once it would be full and every
holder expired (+ 1 s of slack); a key that would be full only after more than 2^53 ms is kept
without an expiry (PERSIST). When the units per token change (period_ms, or the step), u is
rescaled to the new ones: whole tokens kept exactly, a partial token rounded down, a debt kept in
whole tokens rounded up (down to 2^52 units at most, more than 75 minutes of refill at the highest
rate).
crates/core/src/bucket.rs is the Rust model of this script (`take_batch` of the batched form);
tests/model.rs checks they agree bit for bit.
]]

-- Every function below is created once per run (Redis runs this chunk on each call), none per key:
-- a key's step calls them with explicit parameters instead of closing over its locals. Each costs
-- a closure per run, so the helpers are few, and the ones only the batched form needs come after
-- the single form returns.
local MAX_EXACT = 9007199254740992 -- 2^53
local floor = math.floor

-- Exact floor division of non-negative integers a, b (b >= 1).
local function idiv(a, b)
  local q = floor(a / b)
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

-- A decimal integer in [min, 2^53], or nil. Digits only, so tonumber reads it as the integer it
-- spells (rounded above 2^53, where it is refused anyway). `s` is a string or nil: Redis passes
-- every argument as a string.
local function int_arg(s, min)
  if s == nil or #s > 16 or s == '' or string.find(s, '%D') then
    return nil
  end
  -- 2^53 + 1 would read as 2^53: sixteen digits are compared as text.
  if #s == 16 and s > '9007199254740992' then
    return nil
  end
  local n = tonumber(s)
  if n < min or n > MAX_EXACT then
    return nil
  end
  return n
end

-- Integral doubles as plain decimal text (tostring would give "1e+15"). '%d' (a C long) prints
-- the same digits as '%.0f' for a whole n in [1, 2^31) and costs half as much. The batched form
-- sets fmt_memo to a table: the text of every n >= 1 formatted in its run, by value (its keys
-- mostly store the same numbers: the same rule's limits and clock). 0 and -0 are one table key
-- but two texts, so they are never remembered.
local fmt_memo
local function fmt(n)
  if fmt_memo ~= nil and n >= 1 then
    local text = fmt_memo[n]
    if text == nil then
      if n < 2147483648 and n == floor(n) then
        text = string.format('%d', n)
      else
        text = string.format('%.0f', n)
      end
      fmt_memo[n] = text
    end
    return text
  end
  if n >= 1 and n < 2147483648 and n == floor(n) then
    return string.format('%d', n)
  end
  return string.format('%.0f', n)
end

-- Refills a bucket holding u units, refilled up to t, by whole steps up to `to` (t keeps the
-- remainder, so there is no drift), never past cap (what it can hold). Returns the new u and t,
-- and true when the refill reached the cap (what came past it spilled: a new spill epoch).
local function refill(u, t, to, cap, rate, step_us)
  local elapsed = idiv(to - t, step_us)
  if elapsed > 0 then
    local to_full = ceil_div(cap - u, rate)
    if elapsed >= to_full then
      return cap, to, true
    end
    return u + elapsed * rate, t + elapsed * step_us, false
  end
  return u, t, false
end

-- Once refilled to now, `since_ms` (now - t in whole ms) after the last refill point: ms from now
-- until `units` more units have refilled, rounded up (the refill comes at whole steps after t),
-- saturated at 2^53 ms.
local function wait_for(units, rate, step_ms, since_ms)
  if units <= 0 then
    return 0
  end
  local steps = ceil_div(units, rate)
  if steps > idiv(MAX_EXACT, step_ms) then
    return MAX_EXACT
  end
  return steps * step_ms - since_ms
end

-- One atomic step of the bucket at `key`, given the single form's ARGV[1..9] as a1..a9 (nil when
-- absent); `now_or_nil` is the clock when a8 gives none (nil: Redis' TIME, read here). `memo` is
-- nil, or a table the batched form keeps for its run: the limits of the last key whose burst,
-- rate and period_ms were valid, reused when the next key's three arguments are the same strings.
-- Returns the reply's five integers (six with a penalty), or nil and the name of the bad argument:
-- every argument is checked before anything is written.
local function step(key, now_or_nil, memo, a1, a2, a3, a4, a5, a6, a7, a8, a9)
  -- The limits are locals of step, not of the chunk: each local of the chunk that step uses is
  -- one more upvalue to allocate on every run.
  local MAX_FULL = 1125899906842624 -- 2^50
  local MAX_RATE = 1000000000
  local MAX_WAIT_MS = 3600000 -- with rate <= 1e9 the deepest debt stays below 2^53
  -- Added to the key's PEXPIRE. Expiring late is invisible (a stale key refills to full, the same
  -- as an absent one); expiring early would hand out tokens, and Redis was seen expiring a key with
  -- PEXPIRE 1 inside the very script that set it (PTTL -2 right after, redis 7.0.15, under load).
  local EXPIRE_SLACK_MS = 1000
  local MAX_HOLD_MS = 86400000
  local DEBT_FLOOR = -4503599627370496 -- -2^52 units: the deepest debt a rescale keeps
  local MAX_PENALTY_MS = 86400000
  local MAX_PENALTY_WINDOW_MS = 604800000
  local MAX_OFFENCES = 8
  -- A holder whose equal share (burst / holders) is below this reserves nothing.
  local RACE_SHARE = 5
  local MAX_DEMAND = 4294967296 -- 2^32 thousandths of a token per second
  -- A stretch whose marks (N) pass this starts again: every sum of them stays below 2^53.
  local MAX_TAKEN = 2251799813685248 -- 2^51

  if key == nil then
    return nil, 'key'
  end
  local burst, rate, period_ms, step_ms, p_text
  if memo ~= nil and a1 ~= nil and a1 == memo[1] and a2 == memo[2] and a3 == memo[3] then
    burst, rate, period_ms, step_ms, p_text = memo[4], memo[5], memo[6], memo[7], memo[8]
  else
    burst = int_arg(a1, 1)
    if burst == nil then return nil, 'burst' end
    rate = int_arg(a2, 1)
    if rate == nil or rate > MAX_RATE then return nil, 'rate' end
    period_ms = int_arg(a3, 1)
    if period_ms == nil then return nil, 'period_ms' end
    -- The refill step: 1 ms when burst*period_ms fits in 2^50 units; else whole seconds, else
    -- whole minutes, when period_ms is a multiple of them and burst*(period_ms/step_ms) fits. (A
    -- product past 2^53 rounds to at least 2^53, so comparing it with 2^50 is exact.)
    if burst * period_ms <= MAX_FULL then
      step_ms = 1
    elseif period_ms % 1000 == 0 and burst * (period_ms / 1000) <= MAX_FULL then
      step_ms = 1000
    elseif period_ms % 60000 == 0 and burst * (period_ms / 60000) <= MAX_FULL then
      step_ms = 60000
    else
      return nil, 'burst*period_ms'
    end
    if memo ~= nil then
      p_text = fmt(period_ms / step_ms)
      memo[1], memo[2], memo[3], memo[4] = a1, a2, a3, burst
      memo[5], memo[6], memo[7], memo[8] = rate, period_ms, step_ms, p_text
    end
  end
  -- Units per token: the bucket gains `rate` units per whole step.
  local per_token = period_ms / step_ms
  local step_us = step_ms * 1000
  local cost = 1
  if a4 ~= '1' then
    cost = int_arg(a4, 0)
    if cost == nil then return nil, 'cost' end
  end

  -- The lease: "0" (exact mode, the common case: nothing to parse), a plain want, or
  -- want:holder:seq:hold_ms, then back when the count of parts is odd, and one to eight
  -- held:quiet_ms steps, then optionally /demand.
  local lease_want, holder, seq, hold_ms, steps = 0, nil, nil, nil, nil
  local lease_back = 0
  local demand
  local lease = a5
  -- An operator's operation instead of a lease: no take, no holder, no settlement.
  local op, credit
  if lease ~= '0' then
    if lease == 'reset' then
      op = 'reset'
    elseif type(lease) == 'string' and string.sub(lease, 1, 7) == 'credit:' then
      credit = int_arg(string.sub(lease, 8), 1)
      if credit == nil then return nil, 'credit' end
      op = 'credit'
    end
    if op ~= nil then
      if cost ~= 0 then return nil, 'cost' end
      lease = '0'
    end
  end
  if lease ~= '0' and type(lease) == 'string' and string.find(lease, '/', 1, true) then
    local body, d = string.match(lease, '^([%d:]+)/(%d+)$')
    demand = int_arg(d, 0)
    if body == nil or demand == nil or demand > MAX_DEMAND
        or not string.find(body, ':', 1, true) then
      return nil, 'lease'
    end
    lease = body
  end
  if lease ~= '0' then
    if type(lease) ~= 'string' or not string.find(lease, '^%d[%d:]*$')
        or string.find(lease, '::') or string.find(lease, ':$') then
      return nil, 'lease'
    end
    local parts = {}
    for d in string.gmatch(lease, '%d+') do
      parts[#parts + 1] = d
    end
    lease_want = int_arg(parts[1], 0)
    if lease_want == nil then return nil, 'lease' end
    if #parts > 1 then
      if #parts < 6 or #parts > 21 then return nil, 'lease' end
      holder = int_arg(parts[2], 1)
      seq = int_arg(parts[3], 1)
      hold_ms = int_arg(parts[4], 0)
      if holder == nil or seq == nil or hold_ms == nil or hold_ms > MAX_HOLD_MS then
        return nil, 'lease'
      end
      local first = 5
      if #parts % 2 == 1 then
        lease_back = int_arg(parts[5], 0)
        if lease_back == nil then return nil, 'lease' end
        first = 6
      end
      steps = {}
      for i = first, #parts, 2 do
        local held, quiet = int_arg(parts[i], 0), int_arg(parts[i + 1], 0)
        if held == nil or quiet == nil or quiet > MAX_HOLD_MS then return nil, 'lease' end
        steps[#steps + 1] = { held, quiet }
      end
    end
  end

  local max_wait_ms = 0
  if a6 ~= nil and a6 ~= '0' then
    max_wait_ms = int_arg(a6, 0)
    if max_wait_ms == nil or max_wait_ms > MAX_WAIT_MS then return nil, 'max_wait_ms' end
  end

  -- settle: a charge (digits), a refund without an epoch ('-' and digits: gives back nothing),
  -- or "<charge>:<refund>:<epoch>:<mark>" (the bucket tracks its spill epoch; the reply carries
  -- it and the mark of this call's take).
  local settle = 0
  local refund, refund_epoch, refund_mark, track = 0, nil, 0, false
  if a7 ~= nil and a7 ~= '0' then
    if type(a7) == 'string' and string.find(a7, ':', 1, true) then
      local c, r, e, m = string.match(a7, '^(%d+):(%d+):(%d+):(%d+)$')
      settle, refund = int_arg(c, 0), int_arg(r, 0)
      refund_epoch, refund_mark = int_arg(e, 0), int_arg(m, 0)
      if settle == nil or refund == nil or refund_epoch == nil or refund_mark == nil
          or settle > 4 * burst or refund > 4 * burst then
        return nil, 'settle'
      end
      track = true
    else
      local magnitude = a7
      local sign = 1
      if type(magnitude) == 'string' and string.sub(magnitude, 1, 1) == '-' then
        magnitude = string.sub(magnitude, 2)
        sign = -1
      end
      settle = int_arg(magnitude, 0)
      if settle == nil or settle > 4 * burst then return nil, 'settle' end
      if sign < 0 then
        -- A refund without an epoch: nothing is known of when its tokens were taken.
        settle = 0
      end
    end
    if op ~= nil and (settle ~= 0 or refund ~= 0) then return nil, 'settle' end
  end

  local now
  if a8 ~= nil and a8 ~= 'time' then
    now = int_arg(a8, 0)
    if now == nil then return nil, 'now' end
  elseif now_or_nil ~= nil then
    now = now_or_nil
  else
    local tm = redis.call('TIME')
    now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
  end

  -- The penalty box (a9): window_ms, then 1 to 8 non-decreasing durations.
  local pwindow, pms
  if a9 ~= nil and a9 ~= '0' then
    local arg = a9
    if type(arg) ~= 'string' or not string.find(arg, '^%d+:%d[%d:]*$')
        or string.find(arg, '::') or string.find(arg, ':$') then
      return nil, 'penalty'
    end
    pms = {}
    for d in string.gmatch(arg, '%d+') do
      local v = int_arg(d, 1)
      if v == nil then return nil, 'penalty' end
      if pwindow == nil then
        if v > MAX_PENALTY_WINDOW_MS then return nil, 'penalty' end
        pwindow = v
      else
        if v > MAX_PENALTY_MS or (#pms > 0 and v < pms[#pms]) then return nil, 'penalty' end
        pms[#pms + 1] = v
      end
    end
    if #pms < 1 or #pms > MAX_OFFENCES then return nil, 'penalty' end
  end

  -- 1. Load (absent or unreadable = full, no holders), rescale to these units, clamp to what the
  -- bucket can hold, and let expired holders go (refilling up to each one's expiry first).
  local full = burst * per_token
  local h = redis.call('HMGET', key, 'u', 't', 'p', 'o', 'k', 'n', 'm', 's', 'E', 'D', 'N', 'T',
    'W')
  -- A missing field is false (tonumber makes it nil): a new key needs no tonumber at all.
  local u, t, p
  if h[1] and h[2] and h[3] then
    u, t, p = tonumber(h[1]), tonumber(h[2]), tonumber(h[3])
  end
  local o, k, n, m, ds = 0, 0, 0, 0, 0
  -- Whether any of o, k, n, m, s is stored (Redis gives false for a missing field): if none is,
  -- there is nothing for step 5 to delete.
  local holder_fields = h[4] or h[5] or h[6] or h[7] or h[8]
  if holder_fields then
    o = tonumber(h[4]) or 0
    k = tonumber(h[5]) or 0
    n = tonumber(h[6]) or 0
    m = tonumber(h[7]) or 0
    -- A sum with no holder on record weighs nothing (a version before demand reports lets its
    -- last holder go without deleting s).
    if k > 0 then
      ds = tonumber(h[8]) or 0
    end
  end
  -- The spill epoch (only on a bucket that tracks it: one a call asked to, or whose E is
  -- stored; see the header): E, when the current stretch began (us); N, the units taken since
  -- (a take's mark); D, full less the most V + N - R has been since E, less R (R: the units
  -- refunds gave back since E). `renew`: a stretch began in this call (no refund comes back in
  -- it). A stretch begins where V is known: N := 0, D := full - V.
  local tracked = track or h[9]
  local epoch, headroom, taken, renew = 0, 0, 0, false
  local stored_epoch
  -- W: until when (us) a reservation may still wait for its tokens; no refund comes back before.
  local reserved_until = 0
  if tracked then
    stored_epoch = tonumber(h[9])
    epoch, headroom, taken = stored_epoch, tonumber(h[10]), tonumber(h[11])
    if epoch == nil or headroom == nil or taken == nil or epoch < 0 or epoch ~= floor(epoch)
        or headroom ~= floor(headroom) or taken < 0 or taken ~= floor(taken) then
      stored_epoch = nil
      renew = true
    elseif tonumber(h[12]) ~= t or p ~= per_token or taken > MAX_TAKEN then
      -- Another version of the script refilled the bucket (t is not what this one wrote), the
      -- units changed, or the marks grew too large to stay exact: nothing taken before comes
      -- back.
      renew = true
    end
    if stored_epoch ~= nil then
      reserved_until = tonumber(h[13]) or 0
      if reserved_until < 0 or reserved_until ~= floor(reserved_until) then
        reserved_until = 0
      end
    end
  end
  if u == nil or t == nil or p == nil or t < 0 or p < 1
      or u ~= floor(u) or t ~= floor(t) or p ~= floor(p) then
    u = full
    t = now
    -- A missing key is a full bucket: a new stretch, as a spill starts one.
    renew = true
  elseif p ~= per_token then
    if u < 0 then
      -- Debt: rescale by whole tokens, rounding the debt up, never down (kept exact: at most
      -- 2^52 units deep).
      local debt = ceil_div(-u, p)
      if debt > idiv(-DEBT_FLOOR, per_token) then
        u = -(idiv(-DEBT_FLOOR, per_token) * per_token)
      else
        u = -(debt * per_token)
      end
    elseif u <= idiv(MAX_EXACT, per_token) then
      u = idiv(u * per_token, p)
    else
      -- u * per_token could pass 2^53: drop the partial token instead (rounds down, never up).
      u = idiv(u, p) * per_token
    end
  end
  if tracked then
    if renew then
      taken, headroom = 0, full - u - o * per_token
    else
      -- Whatever raised the bucket without this version seeing it counts as held since E.
      headroom = math.min(headroom, full - u - o * per_token - taken)
    end
  end

  -- What the bucket can hold, `cap` below: burst less what holders hold (never below 0, so debt
  -- always refills; only a lowered burst leaves holders holding more than it), recomputed
  -- wherever o changes.
  if now < t then
    t = now -- the clock went back: no refill
  end
  if k > 0 and now >= n then
    -- Some holder expired: it has dropped its tokens by its e<id>, not before. Recount every
    -- holder, then refill up to each expiry in turn, its tokens counted until then.
    local all = redis.call('HGETALL', key)
    local fields = {}
    for i = 1, #all, 2 do
      fields[all[i]] = all[i + 1]
    end
    local gone = {}
    o, k, n, m, ds = 0, 0, 0, 0, 0
    for f, v in pairs(fields) do
      if string.sub(f, 1, 1) == 'e' then
        local id = string.sub(f, 2)
        local e = tonumber(v) or now
        local held = tonumber(fields['h' .. id]) or 0
        o = o + held
        if e <= now then
          gone[#gone + 1] = { e, held, id }
        else
          if k == 0 or e < n then n = e end
          if e > m then m = e end
          k = k + 1
          ds = ds + (tonumber(fields['d' .. id]) or 0)
        end
      end
    end
    local cap = math.max(full - o * per_token, 0)
    if u > cap then
      u = cap
    end
    table.sort(gone, function(x, y) return x[1] < y[1] end)
    for _, g in ipairs(gone) do
      if g[1] > t then
        local c
        u, t, c = refill(u, t, g[1], math.max(full - o * per_token, 0), rate, step_us)
        if tracked and c then
          renew, taken, headroom = true, 0, full - u - o * per_token
        elseif tracked then
          headroom = math.min(headroom, full - u - o * per_token - taken)
        end
      end
      o = o - g[2]
      redis.call('HDEL', key, 'e' .. g[3], 'h' .. g[3], 'q' .. g[3], 'd' .. g[3])
    end
  end
  local cap = math.max(full - o * per_token, 0)
  if u > cap then
    u = cap
  end

  -- 2. Refill by whole steps (t keeps the remainder, so there is no drift),
  -- never past what the bucket can hold. The holder's report only lowers what it holds, each step
  -- from its quiet_ms ago on: the refill before then counts what it held on record.
  local held = 0
  local expires = 0
  local last_seq = 0
  local hid
  -- The holder's demand on record (d<id>), and whether the field is there.
  local hd, hd_field = 0, false
  if holder ~= nil then
    hid = fmt(holder)
    local r = redis.call('HMGET', key, 'h' .. hid, 'e' .. hid, 'q' .. hid, 'd' .. hid)
    held = tonumber(r[1]) or 0
    expires = tonumber(r[2]) or 0
    last_seq = tonumber(r[3]) or 0
    hd_field = r[4]
    hd = tonumber(r[4]) or 0
    if expires <= now then
      -- A fresh holder (the recount dropped an expired one).
      held, expires, last_seq, hd = 0, 0, 0, 0
      k = k + 1
    end
    if seq <= last_seq then
      -- A call the proxy sent before one that already ran here: its report is stale (it may not
      -- count a grant the proxy has since deposited).
      steps = nil
    else
      -- Its latest report of its demand weighs its share (none: it weighs nothing).
      ds = ds - hd + (demand or 0)
      hd = demand or 0
    end
  end

  -- Each step: the holder has held at most steps[i][1] for the last steps[i][2] ms. What it
  -- gives back is at most what its record counts as held before the report: putting it back in
  -- the bucket (below) moves tokens from what holders hold to the bucket, never adds to both.
  local back = 0
  if steps ~= nil then
    back = math.min(lease_back, held)
    for _, report in ipairs(steps) do
      local from = now - report[2] * 1000
      if from > t then
        local c
        u, t, c = refill(u, t, from, math.max(full - o * per_token, 0), rate, step_us)
        if tracked and c then
          renew, taken, headroom = true, 0, full - u - o * per_token
        elseif tracked then
          headroom = math.min(headroom, full - u - o * per_token - taken)
        end
      end
      if report[1] < held then
        o = o - held + report[1]
        held = report[1]
      end
    end
    cap = math.max(full - o * per_token, 0)
  end
  if now - t >= step_us then
    local c
    u, t, c = refill(u, t, now, cap, rate, step_us)
    if tracked and c then
      -- A spill: the new stretch begins here.
      renew, taken, headroom = true, 0, full - u - o * per_token
    end
  end
  if back > 0 then
    u = math.max(u, math.min(u + back * per_token, cap))
  end
  if tracked then
    -- The most V + N - R has been since the stretch began: never below what it is now.
    headroom = math.min(headroom, full - u - o * per_token - taken)
  end
  -- From here on t stays where it is: the whole ms since it, for wait_for.
  local since_ms = idiv(now - t, 1000)
  if tracked and renew and u < 0 then
    -- A stretch that began on a bucket in debt (what came before is unknown): reservations may
    -- be waiting until the refill has repaid it.
    reserved_until = math.max(reserved_until,
      math.min(now + wait_for(-u, rate, step_ms, since_ms) * 1000, MAX_EXACT))
  end

  -- 2b. Settle usage measured after earlier admissions: a charge only lowers the bucket (at most 4
  -- bursts into debt), a refund only raises it (never past what it can hold).
  if settle > 0 then
    u = math.max(u - settle * per_token, math.min(u, -4 * full))
  end
  -- A refund gives back at most D + its mark (in units: part of a token too), and only if no
  -- stretch began since its take (its epoch is still E): the history where the take had been
  -- that much smaller never passes full, so never spills either. D shrinks by it, so a later
  -- refund of the stretch is bounded in that history. A mark is never past N.
  if refund > 0 and not renew and refund_epoch == stored_epoch and now >= reserved_until then
    local x = math.min(refund * per_token, headroom + math.min(refund_mark, taken))
    if x > 0 then
      u = u + x
      headroom = headroom - x
    end
  end

  -- 2c. An operator's operation (cost is 0: step 3 takes nothing).
  if op == 'reset' then
    -- Tokens reserved by requests still held are out, as leased ones are: at most the debt, and
    -- at most what max_wait_ms of refill repays (no reservation reaches deeper).
    local reserved = math.min(math.max(-u, 0), idiv(max_wait_ms + since_ms, step_ms) * rate)
    u = math.max(u, cap - reserved)
    if tracked then
      -- Tokens an operator puts in were never taken: a new stretch, after them.
      renew, taken, headroom = true, 0, full - u - o * per_token
    end
  elseif op == 'credit' and u < cap then
    if credit >= ceil_div(cap - u, per_token) then
      u = cap
    else
      u = u + credit * per_token
    end
    if tracked then
      headroom = math.min(headroom, full - u - o * per_token - taken)
    end
  end

  -- 2d. The penalty box (only with a9): x boxed until, c offences, w the last offence (us).
  local px, pc, pw, penalized = 0, 0, 0, 0
  -- Whether any of x, c, w is stored: if none is, there is nothing for step 5 to delete.
  local penalty_fields = false
  if pms ~= nil then
    local r = redis.call('HMGET', key, 'x', 'c', 'w')
    penalty_fields = r[1] or r[2] or r[3]
    px, pc, pw = tonumber(r[1]) or 0, tonumber(r[2]) or 0, tonumber(r[3]) or 0
    if px < 0 or pc < 0 or pw < 0 or px ~= floor(px) or pc ~= floor(pc)
        or pw ~= floor(pw) or pc > MAX_OFFENCES then
      px, pc, pw = 0, 0, 0
    end
  end
  if op == 'reset' then
    -- The operator lets the key in again: the box and the offences are forgotten.
    redis.call('HDEL', key, 'x', 'c', 'w')
    px, pc, pw = 0, 0, 0
    penalty_fields = false
  end

  -- 3. Decide. racing: a holder whose equal share is under RACE_SHARE tokens (and who is not
  -- alone); paced: a racer's call on a key short of tokens (a grant tells it its next turn).
  local allowed, granted, retry_after_ms
  local racing, paced = false, false
  if cost == 0 then
    allowed, granted, retry_after_ms = 1, 0, 0
  elseif cost > burst then
    allowed, granted, retry_after_ms = 0, 0, -1
  elseif pms ~= nil and px > now then
    -- Boxed: denied until the box ends, nothing taken, no new offence.
    allowed, granted, retry_after_ms = 0, 0, ceil_div(px - now, 1000)
    penalized = 2
  else
    local want = math.min(math.max(cost, lease_want), burst)
    local share = burst
    if holder ~= nil then
      -- A holder's share: the equal one, or, while the bucket holds at least half of what it
      -- can hold, its part by demand when that is more (burst * d is exact below 2^53, and a
      -- product past it rounds to 2^53 or more; past it, burst / floor(s / d)); and room:
      -- holders together hold at most burst.
      local equal = math.max(cost, idiv(burst, k))
      share = equal
      -- A racer (RACE_SHARE) gets its part by demand on a key short of tokens too: its grants
      -- are paced instead (3d), and the others' tokens leave it the rest of the burst, not half.
      racing = equal < RACE_SHARE and equal < burst
      paced = racing and u * 2 < cap
      local half = idiv(burst, 2)
      if racing then
        half = burst
      end
      if hd > 0 and ds > 0 and (u * 2 >= cap or racing) then
        local part
        if burst * hd < MAX_EXACT then
          part = idiv(burst * hd, ds)
        else
          part = idiv(burst, math.max(idiv(ds, hd), 1))
        end
        -- At most what it may hold with the others' tokens at most half the burst.
        share = math.max(equal, math.min(part, burst, half - (o - held)))
      end
      want = math.min(want, share - math.min(share, held), burst - o)
    end
    if want < cost then
      allowed, granted = 0, 0
      retry_after_ms = wait_for(share * per_token, rate, step_ms, since_ms)
    elseif u >= want * per_token or (holder == nil and u >= cost * per_token) then
      granted = math.min(want, idiv(u, per_token))
      u = u - granted * per_token
      allowed, retry_after_ms = 1, 0
    else
      -- Reserve: the bucket goes into debt, paid back by refill within max_wait_ms. The caller
      -- holds the request for retry_after_ms, when those tokens exist. A holder takes what is
      -- there and reserves the rest of what it wants, as far as the wait allows; anyone else
      -- reserves exactly cost. A holder whose share is below RACE_SHARE tokens and below the
      -- burst (it is not alone) reserves nothing: it takes what is there, or is denied until
      -- its turn, when the bucket has refilled a token for every holder on record. The equal
      -- share decides, whatever the holder's demand.
      local reach_ms = max_wait_ms
      -- A take without a record reserves nothing while holders hold tokens: its release time
      -- would be fixed by the refill, and a holder may spend what it holds at that very moment.
      if racing or (holder == nil and o > 0) then
        reach_ms = 0
      end
      local take = cost
      if holder ~= nil then
        take = math.max(cost, math.min(want,
          idiv(u + idiv(reach_ms + since_ms, step_ms) * rate, per_token)))
      end
      local wait_ms = wait_for(take * per_token - u, rate, step_ms, since_ms)
      if wait_ms <= reach_ms then
        u = u - take * per_token
        allowed, granted, retry_after_ms = 1, take, wait_ms
      elseif racing then
        allowed, granted = 0, 0
        retry_after_ms = math.max(wait_ms, wait_for(k * per_token, rate, step_ms, since_ms))
      else
        -- retry_after_ms: until the wait would fit in what it may reserve (until cost is there,
        -- if nothing).
        allowed, granted = 0, 0
        retry_after_ms = wait_ms - reach_ms
      end
    end
  end

  -- 3d. A racer's grant on a key short of tokens, nothing reserved, tells the holder its next
  -- turn, as -ms: the refill of its tokens times the total demand over its own (times the
  -- holders on record, without a demand), so each racer calls at the pace of its part of the
  -- rate by demand rather than for each token as it refills. (A product past 2^53 is at least
  -- the bound in a double too.)
  if paced and allowed == 1 and granted > 0 and retry_after_ms == 0 then
    local per = k
    if hd > 0 and ds > 0 then
      per = math.max(idiv(ds, hd), 1)
    end
    local tokens = math.min(granted * per, idiv(MAX_EXACT, per_token))
    retry_after_ms = -math.max(wait_for(tokens * per_token, rate, step_ms, since_ms), 1)
  end

  -- 3c. A denial by the bucket is an offence: the n-th within pwindow of the previous one boxes the
  -- key for the n-th duration (the last one repeats).
  if pms ~= nil and allowed == 0 and penalized == 0 and retry_after_ms >= 0 then
    if pc > 0 and now - pw <= pwindow * 1000 then
      pc = math.min(pc + 1, MAX_OFFENCES)
    else
      pc = 1
    end
    local d = pms[math.min(pc, #pms)]
    px, pw = now + d * 1000, now
    retry_after_ms = math.max(retry_after_ms, d)
    penalized = 1
  end

  -- A reservation's tokens are promised to its request at its release: no refund comes back
  -- before the last one is released.
  if tracked and allowed == 1 and retry_after_ms > 0 then
    reserved_until = math.max(reserved_until, math.min(now + retry_after_ms * 1000, MAX_EXACT))
  end

  -- A take marks the units taken in the stretch (a holder's grant moves tokens from the bucket
  -- to what holders hold: V, as the bound counts it, stays the same).
  if tracked and holder == nil then
    taken = taken + granted * per_token
  end

  -- 3b. The holder's record: what it holds now, until its last grant's reservation has refilled
  -- and hold_ms more. A holder that was denied stays on record as one asking for a share.
  if holder ~= nil then
    held = held + granted
    o = o + granted
    cap = math.max(full - o * per_token, 0)
    local until_us = now + (math.max(retry_after_ms, 0) * (allowed) + hold_ms) * 1000
    if until_us > expires then
      expires = until_us
    end
    redis.call('HSET', key, 'h' .. hid, fmt(held), 'e' .. hid, fmt(expires),
      'q' .. hid, fmt(math.max(seq, last_seq)))
    if hd > 0 then
      redis.call('HSET', key, 'd' .. hid, fmt(hd))
    elseif hd_field then
      redis.call('HDEL', key, 'd' .. hid)
    end
    if k == 1 or expires < n then n = expires end
    if expires > m then m = expires end
  end

  -- 4. Report.
  local remaining = 0
  if u > 0 then
    remaining = idiv(u, per_token)
  end
  local reset_after_ms = wait_for(cap - u, rate, step_ms, since_ms)

  -- 5. Store: a full bucket with no holders is no key at all, unless it is boxed or remembers an
  -- offence within the window (ms, rounded up).
  local keep_ms = 0
  if pms ~= nil and pc > 0 then
    keep_ms = math.max(ceil_div(math.max(px - now, 0), 1000),
      ceil_div(math.max(pw + pwindow * 1000 - now, 0), 1000))
  end
  if tracked then
    if renew then
      if stored_epoch ~= nil then
        epoch = math.max(now, stored_epoch + 1)
      else
        epoch = now
      end
    end
  end
  if u >= full and k == 0 and keep_ms == 0 then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'u', fmt(u), 't', fmt(t), 'p', p_text or fmt(per_token))
    if tracked then
      redis.call('HSET', key, 'E', fmt(epoch), 'D', fmt(headroom), 'N', fmt(taken), 'T', fmt(t),
        'W', fmt(reserved_until))
    end
    local ttl_ms = reset_after_ms
    if cap ~= full then
      ttl_ms = wait_for(full - u, rate, step_ms, since_ms)
    end
    if k > 0 then
      redis.call('HSET', key, 'o', fmt(o), 'k', fmt(k), 'n', fmt(n), 'm', fmt(m))
      if ds > 0 then
        redis.call('HSET', key, 's', fmt(ds))
      elseif h[8] then
        redis.call('HDEL', key, 's')
      end
      -- The bucket stays short of full until its last holder expires, then refills.
      ttl_ms = ttl_ms + ceil_div(m - now, 1000)
    elseif holder_fields then
      redis.call('HDEL', key, 'o', 'k', 'n', 'm', 's')
    end
    if pms ~= nil then
      if keep_ms > 0 then
        redis.call('HSET', key, 'x', fmt(px), 'c', fmt(pc), 'w', fmt(pw))
      elseif penalty_fields then
        redis.call('HDEL', key, 'x', 'c', 'w')
      end
    end
    ttl_ms = math.max(ttl_ms, keep_ms)
    if ttl_ms + EXPIRE_SLACK_MS > MAX_EXACT then
      -- Full again only in more than 2^53 ms (285,000 years): kept without an expiry, since
      -- expiring early would hand out tokens (and PEXPIRE would not be exact).
      redis.call('PERSIST', key)
    else
      redis.call('PEXPIRE', key, fmt(ttl_ms + EXPIRE_SLACK_MS))
    end
  end

  -- The epoch and the mark go back only to a call that asked for them.
  if not track then
    epoch, taken = nil, nil
  end
  if pms ~= nil or track then
    return allowed, remaining, retry_after_ms, reset_after_ms, granted, penalized, epoch, taken
  end
  return allowed, remaining, retry_after_ms, reset_after_ms, granted
end

-- The single form.
if ARGV[1] ~= 'batch' then
  local allowed, remaining, retry_after_ms, reset_after_ms, granted, penalized, epoch, mark =
    step(KEYS[1], nil, nil, ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8],
      ARGV[9])
  if allowed == nil then
    return redis.error_reply('ERR tollgate: bad argument ' .. remaining)
  end
  if epoch ~= nil then
    return { allowed, remaining, retry_after_ms, reset_after_ms, granted, penalized, epoch, mark }
  end
  if penalized ~= nil then
    return { allowed, remaining, retry_after_ms, reset_after_ms, granted, penalized }
  end
  return { allowed, remaining, retry_after_ms, reset_after_ms, granted }
end

-- The batched form: at most this many keys per call.
local MAX_BATCH_KEYS = 256
-- A group's code for each bad argument (the name in the single form's error), and for an error
-- raised while its step ran.
local CODES = {
  key = 1, burst = 2, rate = 3, period_ms = 4, ['burst*period_ms'] = 5, cost = 6, lease = 7,
  credit = 8, max_wait_ms = 9, settle = 10, now = 11, penalty = 12,
}
local SCRIPT_ERROR = 13

local function bad(name)
  return redis.error_reply('ERR tollgate: bad argument ' .. name)
end

-- The message of an error a step raised if Redis refused it for the server as a whole (OOM,
-- READONLY, ...): every key would get it, and the caller must see it as the single form's error
-- reply (it counts against the backend's health). nil when it concerns one key only (WRONGTYPE)
-- or is a Lua error of the script's own.
local function server_error(e)
  if type(e) == 'table' then
    e = e.err
  end
  if type(e) ~= 'string' then
    return nil
  end
  local word = string.match(e, '^(%u+) ')
  if word == nil or word == 'WRONGTYPE' then
    return nil
  end
  return e
end

-- KEYS[1..n], ARGV = { 'batch', c1, <c1 arguments>, c2, <c2 arguments>, ... }, a count 0 after
-- the first meaning the previous key's arguments again: the whole frame is checked before any
-- step runs, Redis' TIME is read once, then each key's step runs in order (on its slice of ARGV,
-- copied nowhere) and adds six integers to one flat reply.
local function batch()
  local n = #KEYS
  if n < 1 or n > MAX_BATCH_KEYS then
    return bad('batch')
  end
  local i = 2
  for g = 1, n do
    local c = ARGV[i]
    if g > 1 and c == '0' then
      i = i + 1
    -- One digit, 5 to 9 (bytes 53 to 57).
    elseif type(c) ~= 'string' or #c ~= 1 or string.byte(c) < 53 or string.byte(c) > 57 then
      return bad('batch')
    else
      i = i + string.byte(c) - 47
    end
  end
  if i ~= #ARGV + 1 then
    return bad('batch')
  end
  local tm = redis.call('TIME')
  local now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
  local memo = {}
  fmt_memo = {}
  local out = {}
  local at = 0
  i = 2
  -- The key's arguments: ARGV[from..to - 1] (the previous key's again after a count 0).
  local from, to = 0, 0
  for g = 1, n do
    if ARGV[i] == '0' then
      i = i + 1
    else
      from = i + 1
      i = from + string.byte(ARGV[i]) - 48
      to = i
    end
    local ok, allowed, remaining, retry_after_ms, reset_after_ms, granted, penalized, epoch, mark =
      pcall(step, KEYS[g], now, memo, unpack(ARGV, from, to - 1))
    -- A key whose settle argument has the tracked form asked for its epoch and mark: a 7th and
    -- an 8th integer, also when its step failed (0, 0), so the reply's length follows from the
    -- arguments alone.
    local asked = to - from >= 7 and string.find(ARGV[from + 6], ':', 1, true)
    if not ok then
      local e = server_error(allowed)
      if e ~= nil then
        return redis.error_reply(e)
      end
      allowed, remaining = nil, nil
    end
    if allowed == nil then
      out[at + 1], out[at + 2] = -1, CODES[remaining] or SCRIPT_ERROR
      out[at + 3], out[at + 4], out[at + 5], out[at + 6] = 0, 0, 0, 0
    else
      out[at + 1], out[at + 2], out[at + 3] = allowed, remaining, retry_after_ms
      out[at + 4], out[at + 5], out[at + 6] = reset_after_ms, granted, penalized or 0
    end
    at = at + 6
    if asked then
      out[at + 1], out[at + 2] = epoch or 0, mark or 0
      at = at + 2
    end
  end
  return out
end


return batch()
