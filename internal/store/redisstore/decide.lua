#!lua name=charon_@V@
-- Charon's decide function: tiers (doc.go of package tiers) and store.Apply
-- over the items of one call, for the keys of one Redis Cluster slot.
--
-- A Redis 7 function library: Redis runs this chunk once, at FUNCTION LOAD,
-- so the helpers below are defined once, not per call; the call is
-- FCALL charon_decide_@V@ (encode.go's libraryCode puts the hash of this
-- file in place of @V@, so two versions of Charon sharing one Redis each
-- call their own code).
--
-- Every quantity is an integer below 2^53 (times in µs), so Lua's doubles
-- compute exactly what package tiers computes; Unbounded is math.huge.
-- Integer division and floor are written with math.fmod, which is exact.
--
-- KEYS: the call's state keys and global keys (KEYS[1..nk]); in the lock
-- modes, KEYS[nk+i] is the lock key of KEYS[i].
-- ARGV[1]: msgpack array: mode, now (µs; -1: use Redis TIME), maxTTL (ms),
--   lockTTL (ms), nk, n (items), then per item: state key index, global key
--   index (0: none), policy index, hits, min, flags (1 refund, 2 shadow),
--   then for mode 5: the forced abort flag is the mode itself.
-- ARGV[2]: the lock token (lock modes) or "".
-- ARGV[3..]: policies, msgpack arrays (see encode.go):
--   tiers:  0, hard, global, hard width, global width, n, then per tier:
--           limit, window, active, cooldown (>= 0), skippable (0/1), width
--   bucket: 1, unit p, rate r, capacity in units, capacity
--   fixed:  2, limit, window length (µs)
--   closed: 3
-- Modes: 1 decide; 2 decide unless a key is locked; 3 prepare (lock the
-- keys, decide without writing); 4 finish and commit; 5 finish and abort
-- (refunds only); 6 release the locks.
-- Reply: msgpack array: status (0 done, 1 a key is locked, 2 a lock was
-- lost), now (µs), then per item: flags (1 OK, 2 Burst, 4 LimitedByHard,
-- 8 LimitedByGlobal), Granted, Tier, TierHits, DomainHits, ResourceHits,
-- Remaining, RetryAfter (µs), ResetAfter (µs).

local INF = 1 / 0 -- math.huge
local SEC = 1000000
local MAXC = 1125899906842624 -- 2^50, the clamp of copies and min
-- Redis runs the library's chunk without the Lua libraries (math,
-- cmsgpack...): they are bound at the first call.
local fmod, pack, unpack

local function min(a, b)
  if a < b then return a end
  return b
end

local function max(a, b)
  if a > b then return a end
  return b
end

-- floor(a/b)*b for b > 0 (Go: floorDiv(a, b) * b).
local function floormul(a, b)
  local r = fmod(a, b)
  if r < 0 then r = r + b end
  return a - r
end

-- Go's ceilDiv: a/b truncated, plus one when there is a remainder.
local function ceildiv(a, b)
  local r = fmod(a, b)
  local q = (a - r) / b
  if r ~= 0 then q = q + 1 end
  return q
end

-- a/b truncated, for a >= 0, b > 0.
local function idiv(a, b)
  return (a - fmod(a, b)) / b
end

local function clamp(n)
  if n < 0 then return 0 end
  if n > MAXC then return MAXC end
  return n
end

-- ---------------------------------------------------------------------------
-- Hit logs: buckets (start a[i], count c[i]) for i in h..e, strictly
-- increasing starts; sum is the hits of the live buckets. Same operations
-- as tiers/state.go.

local function newlog() return { a = {}, c = {}, h = 1, e = 0, sum = 0 } end

local function lreset(l) l.a, l.c, l.h, l.e, l.sum = {}, {}, 1, 0, 0 end

-- count: hits of the buckets starting after t-w.
local function lcount(l, t, w)
  local n, lim, a, c = l.sum, t - w, l.a, l.c
  for i = l.h, l.e do
    if a[i] > lim then break end
    n = n - c[i]
  end
  return n
end

-- oldest: start of the oldest bucket counted at t, or nil.
local function loldest(l, t, w)
  local lim = t - w
  for i = l.h, l.e do
    if l.a[i] > lim then return l.a[i] end
  end
  return nil
end

-- prune: drop the buckets no longer counted at t.
local function lprune(l, t, w)
  local lim = t - w
  while l.h <= l.e and l.a[l.h] <= lim do
    l.sum = l.sum - l.c[l.h]
    l.h = l.h + 1
  end
  if l.h > l.e then lreset(l) end
end

-- add: n hits at t in buckets of width b, after pruning for window w; a hit
-- at or before the newest bucket's start joins it.
local function ladd(l, t, w, b, n)
  if n <= 0 then return end
  lprune(l, t, w)
  local at = floormul(t, b)
  l.sum = l.sum + n
  if l.e >= l.h and l.a[l.e] >= at then
    l.c[l.e] = l.c[l.e] + n
    return
  end
  l.e = l.e + 1
  l.a[l.e], l.c[l.e] = at, n
end

-- removeNewest: remove up to n hits counted at t, newest first.
local function lremove(l, t, w, n)
  lprune(l, t, w)
  local done = 0
  while done < n and l.e >= l.h do
    local k = l.e
    local take = min(n - done, l.c[k])
    l.c[k] = l.c[k] - take
    l.sum = l.sum - take
    done = done + take
    if l.c[k] == 0 then
      l.a[k], l.c[k] = nil, nil
      l.e = k - 1
    end
  end
  if l.h > l.e then lreset(l) end
  return done
end

-- nextExpiry: the earliest instant after t at which a bucket leaves w.
local function lnext(l, t, w)
  for i = l.h, l.e do
    local x = l.a[i] + w
    if x > t then return x end
  end
  return nil
end

local function llast(l)
  if l.e < l.h then return nil end
  return l.a[l.e]
end

local function lenc(l, o)
  o[#o + 1] = l.e - l.h + 1
  for i = l.h, l.e do
    o[#o + 1] = l.a[i]
    o[#o + 1] = l.c[i]
  end
end

local function ldec(v, p)
  local l = newlog()
  local m = v[p] or 0
  p = p + 1
  for i = 1, m do
    l.a[i], l.c[i] = v[p], v[p + 1]
    l.sum = l.sum + v[p + 1]
    p = p + 2
  end
  l.e = m
  return l, p
end

-- ---------------------------------------------------------------------------
-- Policies and states.

local function decpol(s)
  local v = unpack(s)
  local p = { kind = v[1] }
  if p.kind == 0 then
    p.hard, p.glob, p.hw, p.gw, p.n = v[2], v[3], v[4], v[5], v[6]
    p.T = {}
    local q = 7
    for i = 1, p.n do
      p.T[i] = { lim = v[q], win = v[q + 1], act = v[q + 2], cool = v[q + 3], skip = v[q + 4] == 1, width = v[q + 5] }
      q = q + 6
    end
  elseif p.kind == 1 then
    p.unit, p.r, p.capU, p.cap = v[2], v[3], v[4], v[5]
  elseif p.kind == 2 then
    p.lim, p.len = v[2], v[3]
  end
  return p
end

-- A state blob is a msgpack array whose first element is the kind it was
-- written for (9: a global); a blob of another kind reads as a zero state.
--   tiers:        0, second log, n, then per tier: in (0/1), entered, log
--   bucket/fixed: kind, used (0/1), at, val
--   global:       9, log
-- A log is: m, then m pairs (start, count).
local function decstate(blob, kind)
  local s = { kind = kind, dirty = false }
  local v = nil
  if blob then v = unpack(blob) end
  if type(v) ~= 'table' or v[1] ~= kind then v = nil end
  if kind == 0 then
    s.t, s.nt = {}, 0
    if not v then
      s.sec = newlog()
      return s
    end
    local p
    s.sec, p = ldec(v, 2)
    s.nt = v[p]
    p = p + 1
    for i = 1, s.nt do
      local ts = { inn = v[p] == 1, ent = v[p + 1] }
      ts.hits, p = ldec(v, p + 2)
      s.t[i] = ts
    end
  elseif kind == 9 then
    if v then s.log = ldec(v, 2) else s.log = newlog() end
  else
    if v then
      s.used, s.at, s.val = v[2] == 1, v[3], v[4]
    else
      s.used, s.at, s.val = false, 0, 0
    end
  end
  return s
end

local function encstate(s)
  local o = { s.kind }
  if s.kind == 0 then
    lenc(s.sec, o)
    -- Tiers never entered after the last entered one are not written: they
    -- read back as never entered, which is what they are.
    local nt = 0
    for i = 1, s.nt do
      if s.t[i].inn then nt = i end
    end
    o[#o + 1] = nt
    for i = 1, nt do
      local ts = s.t[i]
      o[#o + 1] = ts.inn and 1 or 0
      o[#o + 1] = ts.ent
      lenc(ts.hits, o)
    end
  elseif s.kind == 9 then
    lenc(s.log, o)
  else
    o[#o + 1] = s.used and 1 or 0
    o[#o + 1] = s.at
    o[#o + 1] = s.val
  end
  return pack(o)
end

local function newd()
  return { ok = false, granted = 0, tier = 0, th = 0, dh = 0, rh = 0, burst = false,
           lh = false, lg = false, rem = 0, retry = 0, reset = 0 }
end

local function closed()
  local d = newd()
  d.retry, d.reset = INF, INF
  return d
end

-- ---------------------------------------------------------------------------
-- Burst tiers (tiers/burst.go). s.t[i] for i <= s.nt; a tier beyond is
-- never entered. g is the global's log or nil.

-- phase: 0 inactive, 1 active, 2 cooldown.
local function phase(p, s, i, t)
  local ts = s.t[i]
  if not ts or not ts.inn then return 0 end
  local tr = p.T[i]
  local e = ts.ent + tr.act
  if t < e then return 1 end
  if t < e + tr.cool then return 2 end
  return 0
end

-- The walker grants hits in chunks at t over a read-only view of the state:
-- c the current tier, cnt its hits, n granted, mask the tiers entered.
local function winit(p, s, g, t)
  local w = { p = p, s = s, t = t, dom = lcount(s.sec, t, SEC), glob = 0, c = 0, cnt = 0, n = 0,
              mask = {}, nm = 0, hard = false, global = false }
  if g then w.glob = lcount(g, t, SEC) end
  -- The current tier is the highest active one.
  for i = p.n, 1, -1 do
    if phase(p, s, i, t) == 1 then
      w.c = i
      w.cnt = lcount(s.t[i].hits, t, p.T[i].win)
      break
    end
  end
  return w
end

local function wcopy(w)
  local x = {}
  for k, v in pairs(w) do x[k] = v end
  local m = {}
  for k, v in pairs(w.mask) do m[k] = v end
  x.mask = m
  return x
end

-- target: the first tier above c that is inactive, passing over skippable
-- tiers in cooldown; 0 when none.
local function target(w)
  local p = w.p
  for j = w.c + 1, p.n do
    local ph = phase(p, w.s, j, w.t)
    if ph == 0 then return j end
    if ph ~= 2 or not p.T[j].skip then return 0 end
  end
  return 0
end

-- run: grant until n reaches limit or nothing more can be granted.
local function run(w, limit)
  w.hard, w.global = false, false
  local p = w.p
  local h, g = p.hard, p.glob
  while w.n < limit do
    local take = limit - w.n
    if h > 0 then
      if w.dom + w.n >= h then w.hard = true; return end
      take = min(take, h - w.dom - w.n)
    end
    if g > 0 then
      if w.glob + w.n >= g then w.global = true; return end
      take = min(take, g - w.glob - w.n)
    end
    local room = 0
    if w.c >= 1 then room = p.T[w.c].lim - w.cnt end
    if room > 0 then
      take = min(take, room)
      w.cnt = w.cnt + take
      w.n = w.n + take
    else
      local j = target(w)
      if j == 0 then return end
      w.c, w.cnt = j, 0
      w.mask[j] = true
      w.nm = w.nm + 1
    end
  end
end

-- next_event: the earliest instant after t at which the state's meaning
-- changes (an entry plus its active period, plus its cooldown, a bucket
-- leaving its window), or nil.
local function next_event(p, s, g, t)
  local best = nil
  local function consider(x)
    if x and x > t and x ~= INF and (best == nil or x < best) then best = x end
  end
  for i = 1, min(p.n, s.nt) do
    local ts = s.t[i]
    if ts.inn then
      local tr = p.T[i]
      local e = ts.ent + tr.act
      consider(e)
      consider(e + tr.cool)
      consider(lnext(ts.hits, t, tr.win))
    end
  end
  consider(lnext(s.sec, t, SEC))
  if g then consider(lnext(g, t, SEC)) end
  return best
end

-- retry_tiers: the wait until max(m, 1) hits would be granted, or INF.
local function retry_tiers(p, s, g, t, k, m)
  local need = max(m, 1)
  if need > k or p.n == 0 or (p.hard > 0 and need > p.hard) or (p.glob > 0 and need > p.glob) then
    return INF
  end
  local cur = t
  while true do
    local nx = next_event(p, s, g, cur)
    if not nx then return INF end
    cur = nx
    local w = winit(p, s, g, cur)
    run(w, need)
    if w.n >= need then return cur - t end
  end
end

-- apply_tiers: commit the walk res that started at tier c0 holding cnt0.
local function apply_tiers(p, s, gs, t, c0, cnt0, res)
  for i = s.nt + 1, p.n do s.t[i] = { inn = false, ent = 0, hits = newlog() } end
  if p.n > s.nt then s.nt = p.n end
  local function addto(i, hits)
    local tr = p.T[i]
    ladd(s.t[i].hits, t, tr.win, tr.width, hits)
  end
  if res.nm == 0 then
    addto(c0, res.n)
  else
    -- The tier left fills up; the tiers entered are entered at t with an
    -- emptied log; the last one gets the rest.
    if c0 >= 1 then
      local x = p.T[c0].lim - cnt0
      if x > 0 then addto(c0, x) end
    end
    for j = c0 + 1, res.c do
      if res.mask[j] then
        local ts = s.t[j]
        ts.inn, ts.ent = true, t
        lreset(ts.hits)
        if j == res.c then addto(j, res.cnt) else addto(j, p.T[j].lim) end
      end
    end
  end
  ladd(s.sec, t, SEC, p.hw, res.n)
  s.dirty = true
  if gs then
    ladd(gs.log, t, SEC, p.gw, res.n)
    gs.dirty = true
  end
end

local function decide_tiers(p, s, gs, t, k, m, commit)
  local g = gs and gs.log
  local d = newd()
  local w = winit(p, s, g, t)
  local c0, cnt0 = w.c, w.cnt
  run(w, k)
  local atK = wcopy(w)
  run(w, MAXC)
  d.lh, d.lg = atK.hard, atK.global
  if atK.n >= m and m <= k then
    d.ok, d.granted = true, atK.n
    d.tier, d.th = atK.c, atK.cnt
    d.burst = atK.nm > 0
    d.dh = atK.dom + atK.n
    if g then d.rh = atK.glob + atK.n end
    d.rem = w.n - atK.n
    if d.tier >= 1 then
      -- ResetAfter: the oldest counted hit of the current tier (t when
      -- entered now) plus its window, minus t.
      local win = p.T[d.tier].win
      local oldest = t
      if not atK.mask[d.tier] then
        local o = loldest(s.t[d.tier].hits, t, win)
        if o then oldest = o end
      end
      d.reset = max(0, oldest + win - t)
    end
    if commit and atK.n > 0 then apply_tiers(p, s, gs, t, c0, cnt0, atK) end
  else
    d.tier, d.th = c0, cnt0
    d.dh = atK.dom
    if g then d.rh = atK.glob end
    d.rem = w.n
    d.retry = retry_tiers(p, s, g, t, k, m)
    d.reset = d.retry
  end
  return d
end

local function refund_tiers(p, s, gs, t, hits)
  local g = gs and gs.log
  local w = winit(p, s, g, t)
  if w.c == 0 or hits <= 0 then return end
  local n = lremove(s.t[w.c].hits, t, p.T[w.c].win, hits)
  lremove(s.sec, t, SEC, n)
  s.dirty = true
  if gs then
    lremove(g, t, SEC, n)
    gs.dirty = true
  end
end

local function forget_tiers(p, s)
  local best = nil
  local function consider(x)
    if best == nil or x > best then best = x end
  end
  for i = 1, s.nt do
    local ts = s.t[i]
    if ts.inn and i <= p.n then
      local tr = p.T[i]
      if tr.act ~= INF then
        consider(ts.ent + tr.act + tr.cool)
      else
        -- A tier above the first active for ever: kept for ever.
        if i > 1 then return INF end
        local at = llast(ts.hits)
        if at then consider(at + tr.win) end
      end
    end
  end
  local at = llast(s.sec)
  if at then consider(at + SEC) end
  return best
end

-- ---------------------------------------------------------------------------
-- Token bucket (tiers/bucket.go): balance val in units at time at.

local function balance(p, s, t)
  if not s.used then return p.capU end
  local b = min(s.val, p.capU)
  local dt = t - s.at
  if dt <= 0 then return b end
  if dt >= ceildiv(p.capU - b, p.r) then return p.capU end
  return b + p.r * dt
end

local function decide_bucket(p, s, t, k, m, commit)
  local unit = p.unit
  local d = newd()
  d.tier = 1
  local b = balance(p, s, t)
  local whole = idiv(b, unit)
  local n = min(k, whole)
  if n >= m and m <= k then
    b = b - n * unit
    d.ok, d.granted = true, n
    d.rem = idiv(b, unit)
    d.th = p.cap - d.rem
    if b < p.capU then d.reset = ceildiv(unit - fmod(b, unit), p.r) end
    if commit and n > 0 then
      s.used, s.val, s.at = true, b, max(s.at, t)
      s.dirty = true
    end
    return d
  end
  d.rem = whole
  d.th = p.cap - whole
  local need = max(m, 1)
  if need > k or need > p.cap then
    d.retry = INF
  else
    d.retry = ceildiv(need * unit - b, p.r)
  end
  d.reset = d.retry
  return d
end

local function refund_bucket(p, s, t, hits)
  if hits <= 0 then return end
  local b = balance(p, s, t)
  hits = min(hits, p.cap)
  s.used, s.val, s.at = true, min(p.capU, b + hits * p.unit), max(s.at, t)
  s.dirty = true
end

local function forget_bucket(p, s)
  if not s.used then return nil end
  if s.val >= p.capU then return s.at end
  return s.at + ceildiv(p.capU - s.val, p.r)
end

-- ---------------------------------------------------------------------------
-- Fixed window (tiers/fixed.go): count val of the window starting at at.

local function fwin(p, s, t)
  local start = floormul(t, p.len)
  if s.used and s.at >= start then return s.at, s.val end
  return start, 0
end

local function decide_fixed(p, s, t, k, m, commit)
  local start, cnt = fwin(p, s, t)
  local lim = p.lim
  local d = newd()
  d.tier = 1
  local reset = start + p.len - t
  local n = min(k, max(0, lim - cnt))
  if n >= m and m <= k then
    d.ok, d.granted = true, n
    d.th = cnt + n
    d.rem = max(0, lim - cnt - n)
    d.reset = reset
    if commit and n > 0 then
      s.used, s.at, s.val = true, start, cnt + n
      s.dirty = true
    end
    return d
  end
  d.th = cnt
  d.rem = max(0, lim - cnt)
  local need = max(m, 1)
  if need > k or need > lim then d.retry = INF else d.retry = reset end
  d.reset = d.retry
  return d
end

local function refund_fixed(p, s, t, hits)
  if hits <= 0 then return end
  local start, cnt = fwin(p, s, t)
  if not s.used or s.at ~= start then return end
  s.val = max(0, cnt - hits)
  s.dirty = true
end

local function forget_fixed(p, s)
  if not s.used or s.val <= 0 then return nil end
  return s.at + p.len
end

-- ---------------------------------------------------------------------------
-- tiers.Peek / tiers.Request, tiers.Refund, tiers.ForgetAt.

local function decide(p, s, gs, t, k, m, commit)
  k, m = clamp(k), clamp(m)
  if p.kind == 0 then return decide_tiers(p, s, gs, t, k, m, commit) end
  if p.kind == 1 then return decide_bucket(p, s, t, k, m, commit) end
  if p.kind == 2 then return decide_fixed(p, s, t, k, m, commit) end
  return closed()
end

local function refund(p, s, gs, t, hits)
  hits = clamp(hits)
  if p.kind == 0 then refund_tiers(p, s, gs, t, hits)
  elseif p.kind == 1 then refund_bucket(p, s, t, hits)
  elseif p.kind == 2 then refund_fixed(p, s, t, hits) end
end

local function forget(p, s)
  if s.kind == 9 then
    local at = llast(s.log)
    if at then return at + SEC end
    return nil
  end
  if p.kind == 0 then return forget_tiers(p, s) end
  if p.kind == 1 then return forget_bucket(p, s) end
  if p.kind == 2 then return forget_fixed(p, s) end
  return nil
end

-- ---------------------------------------------------------------------------
-- The call.


local function fdecide(KEYS, ARGV)
if not fmod then fmod, pack, unpack = math.fmod, cmsgpack.pack, cmsgpack.unpack end
local hdr = unpack(ARGV[1])
local mode, now, maxttl, lockttl, nk, n = hdr[1], hdr[2], hdr[3], hdr[4], hdr[5], hdr[6]
local token = ARGV[2]

if mode >= 2 then
  if mode == 6 then
    for i = 1, nk do
      if redis.call('GET', KEYS[nk + i]) == token then redis.call('DEL', KEYS[nk + i]) end
    end
    return pack({ 0, 0 })
  end
  if mode <= 3 then
    -- Another call holds a lock on one of the keys between its two steps.
    for i = 1, nk do
      if redis.call('EXISTS', KEYS[nk + i]) == 1 then return pack({ 1, 0 }) end
    end
  else
    for i = 1, nk do
      if redis.call('GET', KEYS[nk + i]) ~= token then
        if mode == 4 then return pack({ 2, 0 }) end
      end
    end
  end
end

if now < 0 then
  -- The clock of the Redis master: every process agrees on it. Scripts
  -- are replicated by their effects (Redis 7), so reading it is allowed.
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * SEC + tonumber(tm[2])
end

local pols = {}
local items = {}
local q = 7
for i = 1, n do
  local it = { sk = hdr[q], gk = hdr[q + 1], pi = hdr[q + 2], hits = hdr[q + 3], min = hdr[q + 4] }
  local f = hdr[q + 5]
  it.refund = fmod(f, 2) == 1
  it.shadow = fmod(idiv(f, 2), 2) == 1
  q = q + 6
  if not pols[it.pi] then pols[it.pi] = decpol(ARGV[2 + it.pi]) end
  it.p = pols[it.pi]
  items[i] = it
end

-- Load every key once; items sharing a key share its table.
local st = {}
for i = 1, n do
  local it = items[i]
  if not st[it.sk] then
    local kind = it.p.kind
    if kind > 2 then kind = 3 end
    st[it.sk] = decstate(redis.call('GET', KEYS[it.sk]), kind)
    st[it.sk].p = it.p
  end
  if it.gk > 0 and not st[it.gk] then
    st[it.gk] = decstate(redis.call('GET', KEYS[it.gk]), 9)
  end
end

-- Groups: the take items sharing a state key, led by the first of them,
-- asking for the sum of their hits and minimums (store.Apply).
local lead, gh, gm, first = {}, {}, {}, {}
for i = 1, n do
  local it = items[i]
  if not it.refund then
    local l = first[it.sk]
    if not l then
      l = i
      first[it.sk] = i
      gh[i], gm[i] = 0, 0
    end
    lead[i] = l
    gh[l] = gh[l] + it.hits
    gm[l] = gm[l] + it.min
  end
end

local function gstate(it)
  if it.gk > 0 then return st[it.gk] end
  return nil
end

local out, gr = {}, {}

-- Apply step 1: every refund, in order, then a Peek of one hit.
for i = 1, n do
  local it = items[i]
  if it.refund then
    refund(it.p, st[it.sk], gstate(it), now, it.hits)
    local d = decide(it.p, st[it.sk], gstate(it), now, 1, 1, false)
    d.ok = true
    out[i], gr[i] = d, 0
  end
end

-- Step 2: each group's Peek of its sums, in leader order; a global limit's
-- room is shared with the earlier granted groups of the same global.
local rejected = (mode == 5)
for i = 1, n do
  local it = items[i]
  if not it.refund and lead[i] == i then
    local p = it.p
    local d = decide(p, st[it.sk], gstate(it), now, gh[i], gm[i], false)
    if d.ok and it.gk > 0 and p.kind == 0 and p.glob > 0 then
      local s = 0
      for k = 1, i - 1 do
        local o = items[k]
        if o.gk == it.gk and not o.refund and lead[k] == k and out[k].ok then s = s + out[k].granted end
      end
      local room = p.glob - (d.rh - d.granted) - s
      if room < d.granted then
        if room >= gm[i] then
          d.granted = room
        else
          d.ok, d.granted, d.lg = false, 0, true
          d.rem = max(room, 0)
        end
      end
    end
    out[i] = d
    if not d.ok and not it.shadow then rejected = true end
  end
end

-- split: share the group answer of leader i between its members, in item
-- order: each its min, then the rest up to its hits.
local function split(i)
  local d = out[i]
  local extra = d.granted - gm[i]
  for j = i, n do
    local o = items[j]
    if not o.refund and lead[j] == i then
      out[j] = d
      if not d.ok then
        gr[j] = 0
      else
        local e = min(o.hits - o.min, extra)
        extra = extra - e
        gr[j] = o.min + e
      end
    end
  end
end

if mode == 3 then
  -- Prepare: lock the keys, write nothing, answer the predictions.
  for i = 1, nk do
    redis.call('SET', KEYS[nk + i], token, 'PX', lockttl)
  end
  for i = 1, n do
    if not items[i].refund and lead[i] == i then split(i) end
  end
else
  -- Step 3: a rejected non-shadow group rejects the call: predictions.
  -- Step 4: otherwise commit every group but the rejected shadow ones.
  for i = 1, n do
    local it = items[i]
    if not it.refund and lead[i] == i then
      if not rejected and not (it.shadow and not out[i].ok) then
        out[i] = decide(it.p, st[it.sk], gstate(it), now, gh[i], gm[i], true)
      end
      split(i)
    end
  end
  -- Write what changed: each key expires at its ForgetAt, at most maxttl
  -- from now.
  local nowms = floormul(now, 1000) / 1000
  for k, s in pairs(st) do
    if s.dirty then
      -- ForgetAt nil (zero): the state is equivalent to a fresh one but
      -- for the Burst flag of the next request (a first tier active for
      -- ever stays entered); it expires at now, which on Redis's clock
      -- deletes it at once, and under a caller's clock keeps the flag
      -- exact while that clock is ahead of Redis's.
      local at = forget(s.p, s) or now
      local ms = nowms + maxttl
      if at ~= INF then ms = min(ceildiv(at, 1000), ms) end
      redis.call('SET', KEYS[k], encstate(s), 'PXAT', ms)
    end
  end
  if mode >= 4 then
    for i = 1, nk do
      if redis.call('GET', KEYS[nk + i]) == token then redis.call('DEL', KEYS[nk + i]) end
    end
  end
end

local r = { 0, now }
for i = 1, n do
  local d = out[i]
  local f = 0
  if d.ok then f = f + 1 end
  if d.burst then f = f + 2 end
  if d.lh then f = f + 4 end
  if d.lg then f = f + 8 end
  local x = #r
  r[x + 1], r[x + 2], r[x + 3], r[x + 4], r[x + 5] = f, gr[i], d.tier, d.th, d.dh
  r[x + 6], r[x + 7], r[x + 8], r[x + 9] = d.rh, d.rem, d.retry, d.reset
end
return pack(r)
end

redis.register_function{ function_name = 'charon_decide_@V@', callback = fdecide }
