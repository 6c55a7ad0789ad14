-- A test harness for the tiers part of the decide library: appended to
-- tiers.lua and state.lua (tiers_test.go), it registers one function,
-- charon_tiers_@V@, that applies one operation of package tiers to states
-- passed in their compact form (tiers.State.AppendCompact,
-- Global.AppendCompact) and answers what the tiers part makes of them, so
-- that TestTiersPart compares it with package tiers' Go code.
--
-- ARGV[1]: big-endian doubles: op (1 Request, 2 Peek, 3 Refund; pacing:
--   4 Reserve, 5 PeekReserve, 6 RefundReserved), now (µs), copies (a
--   refund's hits), min, and for ops 4 to 6 the reservation's instant; for
--   op 3 it may be followed by the instant of the take whose slots it
--   gives back (tiers.RefundSlots).
-- ARGV[2]: the policy (encode.go).
-- ARGV[3]: the state's compact form, big-endian doubles.
-- ARGV[4]: the global's compact form, or "" for none.
-- Reply: big-endian doubles: the nine numbers of an item of apply.lua's
-- reply (flags, Granted, Tier, TierHits, DomainHits, ResourceHits,
-- Remaining, RetryAfter, ResetAfter), the state's ForgetAt and the
-- global's (-1: the zero time), then the new state's compact form, its
-- length first, and the global's.

-- doubles: the numbers of s, a string of big-endian doubles.
local function doubles(s)
  local n = #s / 8
  local v = {}
  if n > 0 then
    v = { sunpack(fmt(n), s) }
    v[n + 1] = nil -- sunpack's position after them
  end
  return v
end

-- rlog: the log at v[i] (m, then m pairs), and the index after it.
local function rlog(v, i)
  local m, l = v[i], newlog()
  for j = 1, m do
    l[E], l[2 * j + 2], l[2 * j + 3] = j, v[i + 2 * j - 1], v[i + 2 * j]
    l[SUM] = l[SUM] + v[i + 2 * j]
  end
  return l, i + 1 + 2 * m
end

-- wlog: append log l's compact form to o.
local function wlog(o, l)
  local h, e = l[H], l[E]
  if e < h then
    o[#o + 1] = 0
    return
  end
  o[#o + 1] = e - h + 1
  for j = h, e do
    o[#o + 1] = l[2 * j + 2]
    o[#o + 1] = l[2 * j + 3]
  end
end

local function fromcompact(p, v)
  local s = newstate(statekind(p))
  s.p = p
  if #v == 0 then v = { 0, 0, 0 } end
  if s.kind == 1 then
    -- A bucket's form holds its unit.
    if #v >= 5 then s.used, s.at, s.val, s.unit, s.ahead, s.room = v[2] == 1, v[3], v[4], v[5], v[6] or 0, v[7] or 0 end
    return s
  end
  if s.kind ~= 0 then
    if #v >= 4 then s.used, s.at, s.val, s.ahead, s.room = v[2] == 1, v[3], v[4], v[5] or 0, v[6] or 0 end
    return s
  end
  local i
  s.t = {}
  s.sec, i = rlog(v, 2)
  s.nt = v[i]
  i = i + 1
  for j = 1, s.nt do
    local ts = { inn = v[i] == 1, ent = v[i + 1] }
    ts.hits, i = rlog(v, i + 2)
    s.t[j] = ts
  end
  return s
end

local function tocompact(o, s, kind)
  o[#o + 1] = kind
  if s.kind ~= 0 then
    o[#o + 1] = s.used and 1 or 0
    o[#o + 1] = s.at
    o[#o + 1] = s.val
    if s.kind == 1 then o[#o + 1] = s.unit end
    if s.ahead ~= 0 or s.room ~= 0 then
      o[#o + 1] = s.ahead
      o[#o + 1] = s.room
    end
    return
  end
  wlog(o, s.sec)
  local n = 0
  for j = 1, s.nt do
    if s.t[j].inn then n = j end
  end
  o[#o + 1] = n
  for j = 1, n do
    o[#o + 1] = s.t[j].inn and 1 or 0
    o[#o + 1] = s.t[j].ent
    wlog(o, s.t[j].hits)
  end
end

local function ftiers(KEYS, ARGV)
  if not fmod then bind() end
  local op, now, k, m = sunpack('>dddd', ARGV[1])
  local at = now
  if op >= 4 then
    -- Pacing: decided at now (PRUNE) for the instant at (fdecide's offset).
    at = sunpack('>d', ARGV[1], 33)
    RES, PRUNE = 1, now
  end
  local p = policy(ARGV[2])
  local v = doubles(ARGV[3])
  local kind = v[1] or 0
  local s = fromcompact(p, v)
  local gs = nil
  if ARGV[4] ~= '' then
    local gv = doubles(ARGV[4])
    gs = newstate(9)
    gs.log = rlog(gv, 2)
  end
  local d = newd()
  local slots = nil
  if op == 3 and #ARGV[1] >= 40 then slots = sunpack('>d', ARGV[1], 33) end
  if op == 3 or op == 6 then
    refund(p, s, gs, at, k, slots)
  else
    decide(p, s, gs, at, k, m, op == 1 or op == 4, d)
  end
  RES, PRUNE = 0, nil
  local f = 0
  if d.ok then f = f + 1 end
  if d.burst then f = f + 2 end
  if d.lh then f = f + 4 end
  if d.lg then f = f + 8 end
  local o = { f, d.granted, d.tier, d.th, d.dh, d.rh, d.rem, d.retry, d.reset, forget(p, s) or -1, -1 }
  if gs then o[11] = forget(nil, gs) or -1 end
  local st = {}
  tocompact(st, s, kind)
  o[#o + 1] = #st
  for j = 1, #st do o[#o + 1] = st[j] end
  if gs then
    o[#o + 1] = 9
    wlog(o, gs.log)
  end
  return spack(fmt(#o), tunpack(o, 1, #o))
end

redis.register_function{ function_name = 'charon_tiers_@V@', callback = ftiers }
